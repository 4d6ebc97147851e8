"""Hugging Face transformers' vision encoders, one module per family. Registering them imports
nothing from transformers: their classes are named as "module:QualName"."""

from . import vit

__all__ = ["vit"]
