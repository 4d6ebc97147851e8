"""Hugging Face transformers' vision encoders, one module per family. Registering them imports
nothing from transformers: their classes are named as "module:QualName"."""

from . import clip, dinov2, vit

__all__ = ["clip", "dinov2", "vit"]
