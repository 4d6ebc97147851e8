"""What input a model takes: its image size and normalization."""

from __future__ import annotations

from timm.data import resolve_data_config
from torch import nn

__all__ = ["model_data_config"]


def model_data_config(model: nn.Module) -> dict:
    """timm's data config of ``model`` (``input_size``, ``mean``, ``std``, ...), with the input
    size its patch embedding was built for where it has one (a timm ViT made with ``img_size=``
    keeps the 224 px of its ``pretrained_cfg``), or its config's (transformers) or attribute's
    (torchvision, open_clip) ``image_size``."""
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    size = size if size is not None else _image_size(model)
    overrides = {} if size is None else {"input_size": (3, *(int(s) for s in size))}
    return resolve_data_config(overrides, model=model)


def _image_size(model: nn.Module) -> tuple[int, int] | None:
    """``image_size`` of a transformers config, or of torchvision's or open_clip's ViT (its
    ``visual`` tower)."""
    owners = (getattr(model, "config", None), model, getattr(model, "visual", None))
    for owner in owners:
        size = getattr(owner, "image_size", None)
        if isinstance(size, int) and not isinstance(size, bool):
            return size, size
        if isinstance(size, (tuple, list)) and len(size) == 2:
            return int(size[0]), int(size[1])
    return None
