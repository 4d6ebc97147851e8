"""Each head's output z_h (B, N, d) of torch's fused ``nn.MultiheadAttention`` (torchvision's
ViT, open_clip's towers), whose kernel applies ``out_proj.weight`` itself, so no module sees z.
It is read during the forward from what the module gives: its value input, projected by the
value slice of ``in_proj`` to the values V (B, N, H d), and its per-head weights A (B, H, N, N)
(asked for while the reading hooks are installed), z_h = A_h V_h (Vaswani et al. 2017,
"Attention Is All You Need", Sec. 3.2.2), the heads side by side in torch's order. Only hooks
are installed, all removed on leaving each context."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..families.torch.multihead_attention import with_weights
from ..text.head_values import value_projection

__all__ = ["MultiheadInput", "unreadable"]


def unreadable(attention: nn.MultiheadAttention) -> str | None:
    """Why the heads of ``attention`` cannot be read as A_h V_h over the block's tokens, None
    where they can."""
    if not attention.batch_first:
        return "runs sequence-first (batch_first=False)"
    if attention.bias_k is not None or attention.add_zero_attn:
        return "attends to keys beside the tokens (bias_k or add_zero_attn)"
    return None


@dataclass(frozen=True)
class MultiheadInput:
    """A block whose attention is torch's ``nn.MultiheadAttention`` (readable: `unreadable`)."""

    attention: nn.MultiheadAttention

    @property
    def heads(self) -> int:
        return self.attention.num_heads

    def output_of(self, z: Tensor) -> Tensor:
        """(..., N, C) the module's output for its heads' outputs z (..., N, H d)."""
        out = self.attention.out_proj
        return F.linear(z, out.weight, out.bias)

    @contextmanager
    def reading(self, append: Callable[[Tensor], None]) -> Iterator[None]:
        """Hooks that pass each forward's z (B, N, H d) to ``append``, the module asked for
        its per-head weights meanwhile."""
        values: list[Tensor] = []

        def read_values(module: nn.MultiheadAttention, args: tuple, kwargs: dict) -> None:
            values.append(_values(module, args[2] if len(args) > 2 else kwargs["value"]))

        def read_z(module: nn.Module, args: tuple, output: tuple) -> None:
            weights = output[1]  # (B, H, N, N)
            heads = values.pop().unflatten(-1, (weights.shape[1], -1))  # (B, N, H, d)
            z = torch.einsum("bhqk,bkhd->bqhd", weights.to(heads.dtype), heads)
            append(z.flatten(-2))

        with with_weights(self.attention):
            handles = [
                self.attention.register_forward_pre_hook(read_values, with_kwargs=True),
                self.attention.register_forward_hook(read_z),
            ]
            try:
                yield
            finally:
                for handle in handles:
                    handle.remove()

    @contextmanager
    def probing(self, basis: Tensor) -> Iterator[None]:
        """A hook that makes the module's output what the heads' outputs ``basis`` (B, N, H d)
        give through ``out_proj``, so whatever follows the module (LayerScale, dropout) acts on
        it as on the module's own output."""

        def project(module: nn.Module, args: tuple, output: tuple) -> tuple:
            return (self.output_of(basis.to(output[0].dtype)), *output[1:])

        handle = self.attention.register_forward_hook(project)
        try:
            yield
        finally:
            handle.remove()


def _values(attention: nn.MultiheadAttention, value: Tensor) -> Tensor:
    """(B, N, H d) the values the module computes from its ``value`` input (B, N, C)."""
    return F.linear(value, *value_projection(attention))
