"""`create_model` and `param_count` for timm names and vizkit's own ``vizkit_*`` models.

The ``vizkit_*`` entrypoints are registered with timm's registry (``@register_model``) by the
papers' model modules (`vizkit.papers`), which ``import vizkit`` imports; this package does not
import them (the papers build on it).
"""

from __future__ import annotations

from typing import Any

import timm
from torch import nn

from ..families.transformers.siglip2 import Siglip2Images as Siglip2Images
from . import libraries as libraries
from .counting import param_count as param_count
from .mae import UnmaskedMAE as UnmaskedMAE
from .mae import unmasked_mae as unmasked_mae
from .names import create_timm_model as create_timm_model
from .names import did_you_mean as did_you_mean
from .prompted import PromptedMasks as PromptedMasks
from .prompted import prompted_masks as prompted_masks
from .zero_shot import ImageTower as ImageTower
from .zero_shot import ZeroShotClassifier as ZeroShotClassifier
from .zero_shot import image_tower as image_tower
from .zero_shot import zero_shot as zero_shot
from .zero_shot import zero_shot_predictions as zero_shot_predictions

__all__ = [
    "ImageTower",
    "PromptedMasks",
    "Siglip2Images",
    "UnmaskedMAE",
    "ZeroShotClassifier",
    "create_model",
    "create_timm_model",
    "did_you_mean",
    "image_tower",
    "param_count",
    "prompted_masks",
    "unmasked_mae",
    "zero_shot",
    "zero_shot_predictions",
]


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """Build a model by timm name (``vit_small_patch16_224``, ``vizkit_*``); a pass-through to
    ``timm.create_model`` with the same keyword arguments (``pretrained``, ``num_classes``,
    ``img_size``, ``checkpoint_path``, ...). Offline, ``pretrained=True`` without the weights in
    the local cache raises an OSError saying how to load a local file instead."""
    if not timm.is_model(name):
        close = did_you_mean(name, timm.list_models())
        raise ValueError(f"Unknown model {name!r}.{close} timm.list_models('pattern*') lists all.")
    return create_timm_model(name, **kwargs)
