"""Per-epoch callbacks: each returns values stored in the training history."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis import normalized_entropy
from ..hooks import HookedModel

__all__ = ["AttentionEntropy"]


class AttentionEntropy:
    """Mean normalized attention entropy per layer on the eval batch (1 = uniform, 0 = one key).

    Returns ``{"attention_entropy": {pattern name: value}}``; nothing for models without
    attention patterns.
    """

    def __call__(self, model: nn.Module, epoch: int, eval_batch: Tensor) -> dict:
        hm = HookedModel(model)
        names = [n for n in hm.hook_names() if n.endswith("attn.hook_pattern")]
        if not names:
            return {}
        with torch.no_grad():
            _, cache = hm.run_with_cache(eval_batch, names=names)
        entropy = {name: normalized_entropy(p).mean().item() for name, p in cache.items()}
        return {"attention_entropy": entropy}
