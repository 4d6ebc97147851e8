"""`create_model` and `param_count` for timm names and vizkit's own ``vizkit_*`` models.

The ``vizkit_*`` entrypoints are registered with timm's registry by the papers' model modules
(`vizkit.papers.<paper>.models`), which importing this package imports.
"""

from __future__ import annotations

from typing import Any

import timm
from torch import nn

from .. import papers as papers  # registers every vizkit_* model with timm
from .counting import param_count as param_count

__all__ = [
    "create_model",
    "param_count",
]


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """Build a model by timm name (``vit_small_patch16_224``, ``vizkit_*``); a pass-through to
    ``timm.create_model`` with the same keyword arguments (``pretrained``, ``num_classes``,
    ``img_size``, ``checkpoint_path``, ...)."""
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:8]
        hint = f" Similar names: {', '.join(close)}." if close else ""
        raise ValueError(f"Unknown model {name!r}.{hint} timm.list_models('pattern*') lists all.")
    return timm.create_model(name, **kwargs)
