"""One fingerprint of a model and of a tensor, bit for bit: what a run records to refuse a
resume on other weights or other inputs."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

__all__ = ["model_fingerprint", "tensor_fingerprint"]


def model_fingerprint(model: nn.Module) -> str:
    """A hash of the model's class and every parameter and buffer (names, shapes, dtypes,
    bytes)."""
    digest = hashlib.sha1(type(model).__qualname__.encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor_fingerprint(tensor).encode())
    return digest.hexdigest()


def tensor_fingerprint(tensor: torch.Tensor) -> str:
    """A hash of a tensor's shape, dtype and bytes."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest = hashlib.sha1(f"{tuple(tensor.shape)} {tensor.dtype}".encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
