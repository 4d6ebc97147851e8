"""Activations over a whole data set, on disk: `cache_activations` writes them (resumable,
sharded under ``torchrun``), `ActivationStore` reads one layer back as a Dataset of rows."""

from .reading import ActivationStore as ActivationStore
from .tokens import TOKEN_CHOICES as TOKEN_CHOICES
from .writing import cache_activations as cache_activations

__all__ = ["TOKEN_CHOICES", "ActivationStore", "cache_activations"]
