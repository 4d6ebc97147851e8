"""Hugging Face transformers' vision encoders, one module per family. Registering them imports
nothing from transformers: their classes are named as "module:QualName"."""

from . import aimv2, beit, clip, dinov2, dinov3, hiera, sam2, siglip2, swin, vit

__all__ = [
    "aimv2", "beit", "clip", "dinov2", "dinov3", "hiera", "sam2", "siglip2", "swin", "vit",
]  # fmt: skip
