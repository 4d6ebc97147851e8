"""Families as plug-ins: one module per family holds everything vizkit knows about it (its
blocks and token layout, residual branches, attention sites) and registers it against the module
classes it handles (`vizkit.hooks.family`). The hook core asks the registry and names no family.

Writing a family takes the names below; docs/how-to/add-an-adapter.md walks through one.
Importing this package registers the built-in families (the hook core does on its first lookup).
"""

from ..hooks.family import AttentionContext as AttentionContext
from ..hooks.family import BlockSite as BlockSite
from ..hooks.family import Family as Family
from ..hooks.family import FamilyLayout as FamilyLayout
from ..hooks.family import ResidualSpec as ResidualSpec
from ..hooks.family import families as families
from ..hooks.family import register_family as register_family
from ..hooks.sites import captured as captured
from ..hooks.sites import recomputed as recomputed
from . import grids as grids
from . import open_clip as open_clip
from . import timm as timm
from . import torch as torch
from . import torchvision as torchvision
from . import transformers as transformers

__all__ = [
    "AttentionContext",
    "BlockSite",
    "Family",
    "FamilyLayout",
    "ResidualSpec",
    "captured",
    "families",
    "grids",
    "recomputed",
    "register_family",
]
