"""Parameter counts of registered models without allocating them (built on the meta device)."""

from __future__ import annotations

import timm
import torch

__all__ = ["param_count"]


def param_count(name: str, trainable_only: bool = False, **kwargs) -> int:
    """Parameters of ``timm.create_model(name, **kwargs)``, built on the meta device (a paper's
    sizes cost nothing). ``trainable_only`` leaves out frozen ones (SoT's fixed position table)."""
    with torch.device("meta"):
        model = timm.create_model(name, **kwargs)
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
