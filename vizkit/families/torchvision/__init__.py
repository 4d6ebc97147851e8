"""torchvision's vision transformers, one module per family. Registering them imports nothing
from torchvision: their classes are named as "module:QualName"."""

from . import maxvit, swin, vit

__all__ = ["maxvit", "swin", "vit"]
