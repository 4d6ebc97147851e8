"""Saliency methods, one per file, each registered in `vizkit.methods.registry` with what it
needs; the analyses they build on (`vizkit.analysis`) never import this package.

Importing this package imports only the registry; the first read of `METHODS` imports every
module of the package (`vizkit.methods.builtin`), so a method file placed here is found without
being listed anywhere, and `vizkit` exports it under its function's name."""

from .registry import METHODS as METHODS
from .registry import NEEDS as NEEDS
from .registry import SaliencyMethod as SaliencyMethod
from .registry import default_methods as default_methods
from .registry import saliency_method as saliency_method
from .registry import selected_methods as selected_methods

__all__ = [
    "METHODS",
    "NEEDS",
    "SaliencyMethod",
    "default_methods",
    "saliency_method",
    "selected_methods",
]
