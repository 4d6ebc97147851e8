"""Named weight initializations a recipe can apply after building its timm model."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["INITS", "identity_talking_heads"]


def identity_talking_heads(model: nn.Module) -> int:
    """Add the identity to CaiT's talking-heads mixing matrices (``proj_l`` before and
    ``proj_w`` after the softmax, each Linear(H, H)), on top of timm's trunc-normal(0.02) init.

    timm starts both near zero, so the pre-softmax logits are scaled by about 0.02 (uniform
    attention) and the attention output by about 0.02: the self-attention stage learns slowly.
    From the identity the model starts as plain multi-head attention and learns the mixing.
    The CaiT paper does not state this init. Returns the number of matrices changed.
    """
    changed = 0
    with torch.no_grad():
        for module in model.modules():
            for name in ("proj_l", "proj_w"):
                layer = getattr(module, name, None)
                if isinstance(layer, nn.Linear) and layer.in_features == layer.out_features:
                    layer.weight += torch.eye(layer.in_features, device=layer.weight.device)
                    changed += 1
    if not changed:
        raise ValueError("identity_talking_heads: the model has no talking-heads attention.")
    return changed


INITS: dict[str, Callable[[nn.Module], int]] = {"identity_talking_heads": identity_talking_heads}
