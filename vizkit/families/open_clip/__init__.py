"""open_clip's vision towers. Registering them imports nothing from open_clip: their classes
are named as "module:QualName". Towers built on timm (``TimmModel``) hold a timm model, which
keeps its timm family (`vizkit.hooks.family.family_layout` finds it inside)."""

from . import vit

__all__ = ["vit"]
