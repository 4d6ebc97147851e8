"""Hugging Face transformers' vision encoders, one module per family. Registering them imports
nothing from transformers: their classes are named as "module:QualName"."""

from . import (
    aimv2,
    beit,
    clip,
    dinov2,
    dinov3,
    dpt,
    hiera,
    sam,
    sam2,
    segformer,
    siglip2,
    swin,
    timesformer,
    videomae,
    vit,
    vivit,
    vjepa2,
)

__all__ = [
    "aimv2", "beit", "clip", "dinov2", "dinov3", "dpt", "hiera", "sam", "sam2", "segformer",
    "siglip2", "swin", "timesformer", "videomae", "vit", "vivit", "vjepa2",
]  # fmt: skip
