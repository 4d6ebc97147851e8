"""vizkit's timm-registered models (``vizkit_*``) and `create_model`.

Importing this package registers every ``vizkit_*`` entrypoint with timm's registry.
"""

from __future__ import annotations

from typing import Any

import timm
from torch import nn

from . import cait_variants as cait_variants  # registers vizkit_vit_tiny_*, vizkit_cait_tiny_*
from . import masked_vit as masked_vit  # registers vizkit_{gap,elm,gmm}_vit_*
from . import refined_vit as refined_vit  # registers vizkit_refined_vit_*
from . import sot_vit as sot_vit  # registers vizkit_sot_*
from .cait_family import cait_family_table as cait_family_table
from .counting import param_count as param_count
from .masked_vit import masked_vit_params as masked_vit_params
from .refined_vit import refined_vit_params as refined_vit_params
from .sot_vit import with_sot_head as with_sot_head

__all__ = [
    "cait_family_table",
    "cait_variants",
    "create_model",
    "masked_vit",
    "masked_vit_params",
    "param_count",
    "refined_vit",
    "refined_vit_params",
    "sot_vit",
    "with_sot_head",
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
