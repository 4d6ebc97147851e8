"""Analyses: pure torch, no plotting."""

from .entropy import normalized_entropy as normalized_entropy

__all__ = ["normalized_entropy"]
