"""Hugging Face transformers' vision encoders, one module per family. Registering them imports
nothing from transformers: their classes are named as "module:QualName"."""

from . import beit, clip, dinov2, siglip2, swin, vit

__all__ = ["beit", "clip", "dinov2", "siglip2", "swin", "vit"]
