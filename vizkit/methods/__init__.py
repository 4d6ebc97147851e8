"""Saliency methods, one per file, registered in `vizkit.methods.registry` with what they need.

Importing this package imports only the registry (the analyses register their methods with
it); `vizkit` imports the method modules (`vizkit.methods.builtin`) and `vk.smoothed`
(`vizkit.methods.smoothing`), which smooths any of them."""

from .registry import METHODS as METHODS
from .registry import NEEDS as NEEDS
from .registry import SaliencyMethod as SaliencyMethod
from .registry import default_methods as default_methods
from .registry import methods as methods
from .registry import saliency_method as saliency_method
from .registry import selected_methods as selected_methods

__all__ = [
    "METHODS",
    "NEEDS",
    "SaliencyMethod",
    "default_methods",
    "methods",
    "saliency_method",
    "selected_methods",
]
