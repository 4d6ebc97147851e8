"""One fingerprint of a model and of a tensor, bit for bit: what a run records to refuse a
resume on other weights or other inputs."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

__all__ = ["model_fingerprint", "tensor_fingerprint"]


def model_fingerprint(model: nn.Module) -> str:
    """A hash of the model's class and every parameter and buffer (names, shapes, dtypes,
    bytes); the tensors are hashed side by side (SHA-1 releases the GIL), combined in order."""
    state = model.state_dict()
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        parts = pool.map(tensor_fingerprint, state.values())
        digest = hashlib.sha1(type(model).__qualname__.encode())
        for name, part in zip(state, parts, strict=True):
            digest.update(name.encode())
            digest.update(part.encode())
    return digest.hexdigest()


def tensor_fingerprint(tensor: torch.Tensor) -> str:
    """A hash of a tensor's shape, dtype and bytes (read in place, not copied)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest = hashlib.sha1(f"{tuple(tensor.shape)} {tensor.dtype}".encode())
    digest.update(memoryview(flat.view(torch.uint8).numpy()))
    return digest.hexdigest()
