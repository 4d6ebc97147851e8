"""An attention-pooling head read as an affine map of the stream, for the decomposition: SigLIP's
(``SiglipMultiheadAttentionPoolingHead`` in transformers; Zhai et al. 2023, "Sigmoid Loss for
Language Image Pre-Training", with the MAP head of Lee et al. 2019) pools the final-normed
tokens y = norm(s) by a learned probe's attention a (H, N), z = W_O concat_h(sum_j a_hj (W_V^h
y_j + b_V^h)) + b_O, then adds an MLP of z: e = z + mlp(norm(z)). With the map and the final
norm's scale frozen at their clean values, z is affine in the stream; the MLP's term is kept as a
part of its own ("head mlp"), as the SigLIP decomposition of TextSpan's authors keeps it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.linear_head import LinearHead
from ..analysis.residual_stream import norm_scale, norm_with_scale
from ..hooks import HookedModel

__all__ = ["PoolingReadout", "pooled_output", "pooling_head"]


def pooling_head(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(the final norm, the attention-pooling head) of a transformers SigLIP vision tower inside
    ``model``; None where it has none."""
    for module in model.modules():
        head = getattr(module, "head", None)
        norm = getattr(module, "post_layernorm", None)
        if (isinstance(norm, nn.LayerNorm) and isinstance(getattr(head, "attention", None),
                                                          nn.MultiheadAttention)
                and isinstance(getattr(head, "probe", None), Tensor)):  # fmt: skip
            return norm, head
    return None


@contextmanager
def pooled_output(model: nn.Module) -> Iterator[dict]:
    """``{"z": (B, D)}``, filled during one forward inside the context with the output of the
    attention-pooling head's attention (its probe's row)."""
    seen: dict[str, Tensor] = {}

    def read_z(module, args, output) -> None:
        seen["z"] = output[0][:, 0].detach()

    handle = pooling_head(model)[1].attention.register_forward_hook(read_z)
    try:
        yield seen
    finally:
        handle.remove()


class PoolingReadout:
    """The pooling head's attention output z (B, D) for a stream (B, N, C), its map and the final
    norm's scale frozen at their values on the clean run of images x; ``remainder`` (B, D) the
    head MLP's term on that run (e = z + remainder)."""

    def __init__(
        self, hm: HookedModel, x: Tensor, blocks: list[str], embedding: Tensor,
        run: tuple[Tensor, Tensor] | None = None,
    ) -> None:  # fmt: skip
        """``run``: (the last block's output, `pooled_output`'s z) of a clean run on x already
        made; None: one is made here."""
        self.hm = hm
        self.norm, self.head = pooling_head(hm.model)
        if run is None:
            last = f"{blocks[-1]}.hook_resid_post"
            with pooled_output(hm.model) as seen, torch.no_grad():
                _, cache = hm.run_with_cache(x, last)
            run = cache[last], seen["z"]
        stream, pooled = run
        self.stream = stream.float()
        self.scale = norm_scale(self.norm, self.stream)
        with torch.no_grad():
            self.map = self._map(self.norm(self.stream))  # (B, H, N)
            z = self(self.stream)
        scale = pooled.abs().max().clamp_min(1e-12)
        error = float((z - pooled.float()).abs().max() / scale)
        if not error <= 1e-4:
            raise ValueError(
                f"The attention-pooling head written out differs from the model's by {error:.1e} "
                "of its scale, so its output cannot be split here."
            )
        self.remainder = embedding - pooled.float()

    def _attention(self) -> tuple[int, Tensor, Tensor, Tensor, Tensor]:
        attention = self.head.attention
        w_q, w_k, w_v = attention.in_proj_weight.chunk(3)
        b_q, b_k, b_v = attention.in_proj_bias.chunk(3)
        return attention.num_heads, (w_q, b_q), (w_k, b_k), (w_v, b_v), attention.out_proj

    def _map(self, y: Tensor) -> Tensor:
        """(B, H, N) the probe's attention over the normed tokens y (B, N, C)."""
        heads, (w_q, b_q), (w_k, b_k), _, _ = self._attention()
        q = F.linear(self.head.probe[:, 0], w_q, b_q).unflatten(-1, (heads, -1))  # (1, H, d)
        k = F.linear(y, w_k, b_k).unflatten(-1, (heads, -1))  # (B, N, H, d)
        logits = torch.einsum("ohd,bnhd->bhn", q, k) / q.shape[-1] ** 0.5
        return logits.softmax(-1)

    def __call__(self, stream: Tensor, frozen: bool = True) -> Tensor:
        """(B, D) z for streams (B, N, C), affine in them (the map and norm scale frozen)."""
        heads, _, _, (w_v, b_v), out = self._attention()
        y = norm_with_scale(self.norm, stream, self.scale.to(stream.device))
        v = F.linear(y, w_v, b_v).unflatten(-1, (heads, -1))  # (B, N, H, d)
        pooled = torch.einsum("bhn,bnhd->bhd", self.map.to(v.dtype), v).flatten(1)
        return F.linear(pooled, out.weight, out.bias)

    def linear_head(self) -> LinearHead:
        """The frozen head's linear part as one read per pooling head k: weights a_k[q] over
        the clean norm scale of token q, map W_O^k W_V^k diag(norm weight), centred."""
        heads, _, _, (w_v, _), out = self._attention()
        weights = self.map.float() / self.scale[..., 0].float()[:, None]  # (B, H, N)
        gain = self.norm.weight if self.norm.weight is not None else torch.ones(w_v.shape[1])
        values = (w_v * gain).detach().float().unflatten(0, (heads, -1))  # (H, d, C)
        out_w = out.weight.detach().float().unflatten(1, (heads, -1))  # (D, H, d)
        maps = torch.einsum("ehd,hdc->hec", out_w, values)  # (H, D, C)
        return LinearHead(weights, (maps - maps.mean(-1, keepdim=True))[None])
