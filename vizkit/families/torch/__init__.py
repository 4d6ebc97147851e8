"""PyTorch's own attention layer, shared by the families of several libraries."""

from . import multihead_attention

__all__ = ["multihead_attention"]
