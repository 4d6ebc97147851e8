"""Each head's output before the attention's output projection, z_h (B, N, d): read as its
slice of the projection's input, heads side by side (timm, transformers). The projection is
linear, so the head writes W_O^h z_h to the stream and a change of z_h changes the score by
that change times the score's gradient at z_h (Elhage et al. 2021, "A Mathematical Framework
for Transformer Circuits", Sec. 2.2: the attention output as a sum over heads)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten

from ..analysis.residual_stream import edited_forward, output_projection, pattern_name
from ..hooks import HookedModel

__all__ = ["HeadInputs", "head_inputs"]

TOLERANCE = 1e-4  # relative to the output's largest magnitude


@dataclass(frozen=True)
class HeadInputs:
    """Per block, its output projection (the Linear whose input holds the heads' outputs side
    by side) and its number of heads."""

    projections: tuple[nn.Module, ...]
    heads: tuple[int, ...]


def head_inputs(hm: HookedModel, x: Tensor, blocks: list[str]) -> HeadInputs:
    """The output projections of ``blocks`` on images x (B, C, H, W), checked to take the
    heads' outputs side by side in head order: with one head's slice of every projection's
    input zeroed, the model gives the same logits as with that head's attention map zeroed in
    every block (one image, H copies, two forwards).

    Raises:
        ValueError: a block without one editable attention map or an output projection (a
            fused kernel: torch's MultiheadAttention), or whose heads are not its projection
            input's slices in order; use heads=False (each block's attention as one node)."""
    patterns, projections, counts = [], [], []
    for block in blocks:
        pattern = pattern_name(hm, block)
        if pattern is None:
            raise ValueError(_without_heads(block, "has no single attention map (hook_pattern)"))
        with torch.no_grad():
            _, cache = hm.run_with_cache(x[:1], pattern, pattern_path="unfused")
        heads = cache[pattern].shape[1]
        projection = output_projection(hm, x[:1], block, heads)
        if projection is None:
            raise ValueError(_without_heads(block, "has no output projection vizkit can read "
                                                   "(a fused attention kernel)"))  # fmt: skip
        patterns.append(pattern)
        projections.append(projection)
        counts.append(heads)
    _check_head_order(hm, x[:1], patterns, projections, counts)
    return HeadInputs(tuple(projections), tuple(counts))


def _check_head_order(
    hm: HookedModel, x: Tensor, patterns: list[str], projections: list[nn.Module],
    counts: list[int],
) -> None:  # fmt: skip
    """Zero head h in every block of copy h of the image x (1, C, H, W), once by its map and
    once by its slice of the projection input; the logits must agree."""
    copies = max(counts)

    def zero_map(p: Tensor) -> Tensor:  # (copies, 1, H, N, N)
        keep = 1 - torch.eye(copies, p.shape[2], dtype=p.dtype, device=p.device)
        return p * keep.view(copies, 1, p.shape[2], *[1] * (p.ndim - 3))

    def zero_slice(module: nn.Module, args: tuple) -> tuple:
        z = args[0]  # (copies, ..., H * d)
        heads = counts[projections.index(module)]
        keep = 1 - torch.eye(copies, heads, dtype=z.dtype, device=z.device)
        parts = z.view(copies, *z.shape[1:-1], heads, z.shape[-1] // heads)
        mask = keep.view(copies, *[1] * (z.ndim - 2), heads, 1)
        return ((parts * mask).reshape(z.shape), *args[1:])

    by_map = edited_forward(hm, x, dict.fromkeys(patterns, zero_map), copies)
    handles = [p.register_forward_pre_hook(zero_slice) for p in dict.fromkeys(projections)]
    try:
        by_slice = edited_forward(hm, x, {}, copies)
    finally:
        for handle in handles:
            handle.remove()
    by_map, by_slice = _outputs(by_map), _outputs(by_slice)
    scale = by_map.abs().max().clamp_min(1e-12)
    if not float((by_map - by_slice).abs().max() / scale) <= TOLERANCE:
        raise ValueError(_without_heads(
            "the attention", "takes its heads' outputs in another order than side by side at "
            "the output projection's input"))  # fmt: skip


def _outputs(output: object) -> Tensor:
    """The floating-point tensors of a model output, flattened and joined."""
    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, Tensor)]
    return torch.cat([t.float().flatten() for t in tensors if t.is_floating_point()])


def _without_heads(where: str, why: str) -> str:
    return (
        f"{where} {why}, so its heads' outputs cannot be read one by one. Use heads=False: each "
        "block's attention is then one node."
    )
