"""What input a model takes: its image size and normalization."""

from __future__ import annotations

from timm.data import resolve_data_config
from torch import nn

__all__ = ["model_data_config"]


def model_data_config(model: nn.Module) -> dict:
    """timm's data config of ``model`` (``input_size``, ``mean``, ``std``, ...), with the input
    size its patch embedding was built for where it has one (a timm ViT made with ``img_size=``
    keeps the 224 px of its ``pretrained_cfg``)."""
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    overrides = {} if size is None else {"input_size": (3, *(int(s) for s in size))}
    return resolve_data_config(overrides, model=model)
