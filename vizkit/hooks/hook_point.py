"""HookPoint: an identity module that gives an activation inside a vizkit layer a canonical name."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["HookPoint"]


class HookPoint(nn.Module):
    """Identity module. Route an activation through it and the activation gets the module's path
    as its canonical name (``blocks.3.attn.hook_scores``); `HookedModel` discovers every HookPoint.
    """

    def forward(self, x: Tensor) -> Tensor:
        return x
