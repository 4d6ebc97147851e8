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

from ..analysis.residual_stream import edited_forward, output_projections, pattern_name
from ..hooks import HookedModel

__all__ = ["HeadInputs", "ProjectionMap", "head_inputs", "projection_maps"]

TOLERANCE = 1e-4  # relative to the output's largest magnitude


@dataclass(frozen=True)
class HeadInputs:
    """Per block (``blocks``), its output projection (the Linear whose input holds the heads'
    outputs side by side) and its number of heads."""

    blocks: tuple[str, ...]
    projections: tuple[nn.Module, ...]
    heads: tuple[int, ...]


def head_inputs(hm: HookedModel, x: Tensor, blocks: list[str]) -> HeadInputs:
    """The output projections of ``blocks`` on images x (B, C, H, W), checked to take the
    heads' outputs side by side in head order: with one head's slice of every projection's
    input zeroed, the model gives the same logits as with that head's attention map zeroed in
    every block (one image, H copies, two forwards). Where the maps cannot be edited on the
    output's path (transformers compute them beside the output), the slices are taken in head
    order unchecked, as `vizkit.analysis.residual_stream.head_outputs` splits heads there.

    Raises:
        ValueError: a block without one editable attention map or an output projection (a
            fused kernel: torch's MultiheadAttention), or whose heads are not its projection
            input's slices in order; use heads=False (each block's attention as one node)."""
    patterns = [pattern_name(hm, block) for block in blocks]
    for block, pattern in zip(blocks, patterns, strict=True):
        if pattern is None:
            raise ValueError(_without_heads(block, "has no single attention map (hook_pattern)"))
    with torch.no_grad():
        _, cache = hm.run_with_cache(x[:1], patterns, pattern_path="unfused")
    counts = [cache[pattern].shape[1] for pattern in patterns]
    projections = output_projections(hm, x[:1], blocks, counts)
    for block, projection in zip(blocks, projections, strict=True):
        if projection is None:
            raise ValueError(_without_heads(block, "has no output projection vizkit can read "
                                                   "(a fused attention kernel)"))  # fmt: skip
    _check_head_order(hm, x[:1], patterns, projections, counts)
    return HeadInputs(tuple(blocks), tuple(projections), tuple(counts))


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

    try:
        by_map = edited_forward(hm, x, dict.fromkeys(patterns, zero_map), copies)
    except ValueError:  # the maps are computed beside the output (transformers' attention):
        return  # the slices are taken in head order, as `head_outputs` takes them there
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


@dataclass(frozen=True)
class ProjectionMap:
    """A block's attention output as an affine function of its heads' outputs at each token:
    attn_out[:, n] = z[:, n] @ weight.T + bias[n], weight (C, H d), bias (N, C); so head h
    writes z_h @ weight[:, its slice].T."""

    weight: Tensor
    bias: Tensor

    def each_head(self, z: Tensor, heads: int) -> Tensor:
        """(B, N, H, C) what each of the ``heads`` heads of z (B, N, H d) writes."""
        weight = self.weight.view(self.weight.shape[0], heads, -1)  # (C, H, d)
        return torch.einsum("bnhe,che->bnhc", z.unflatten(-1, (heads, -1)), weight)

    def of_heads(self, z: Tensor, keep: Tensor) -> Tensor:
        """(..., N, C) what the heads ``keep`` ((H,) bool) of z (..., N, H d) write together."""
        mask = keep.to(z.device, z.dtype).repeat_interleave(z.shape[-1] // len(keep))
        return (z * mask) @ self.weight.T


def projection_maps(
    hm: HookedModel, x: Tensor, found: HeadInputs, z: list[Tensor], attn: list[Tensor]
) -> list[ProjectionMap]:
    """Each block's `ProjectionMap`, measured on one image of x (B, C, H, W) by setting its
    projection's input to basis vectors, a token each (copies of the image), and checked on
    the run whose heads' outputs ``z`` and attention outputs ``attn`` (per block) are given.

    Raises:
        ValueError: the map is not one affine map per token (the output is not linear in the
            heads, or a token's output reads other tokens' heads)."""
    tokens, width = z[0].shape[-2], z[0].shape[-1]
    if any(t.ndim != 3 or t.shape[-2:] != (tokens, width) for t in z):
        raise ValueError(_without_heads("a block", "gives its projection other than (B, N, H d)"))
    copies = -(-width // tokens) + 1  # the basis over the tokens of copies, then a zero copy
    basis = torch.zeros(copies * tokens, width, dtype=z[0].dtype, device=x.device)
    basis[:width] = torch.eye(width, dtype=z[0].dtype, device=x.device)
    probe = basis.view(copies, tokens, width)
    outputs: dict[str, Tensor] = {}

    def set_basis(module: nn.Module, args: tuple) -> tuple:
        return (probe.to(args[0].dtype), *args[1:])

    def keep(name: str):
        def read(t: Tensor) -> Tensor:  # (copies, 1, N, C)
            outputs[name] = t[:, 0].clone()
            return t

        return read

    names = [f"{block}.hook_attn_out" for block in found.blocks]
    handles = [p.register_forward_pre_hook(set_basis) for p in found.projections]
    try:
        edited_forward(hm, x[:1], {n: keep(n) for n in names}, copies)
    finally:
        for handle in handles:
            handle.remove()
    maps = []
    for name, own_z, own_attn in zip(names, z, attn, strict=True):
        out = outputs[name].flatten(0, 1)  # (copies N, C)
        bias = outputs[name][-1]  # (N, C)
        columns = out[:width] - bias.repeat(copies - 1, 1)[:width]
        made = ProjectionMap(columns.T.contiguous(), bias)
        rebuilt = own_z @ made.weight.T + bias
        scale = own_attn.abs().max().clamp_min(1e-12)
        if not float((rebuilt - own_attn).abs().max() / scale) <= TOLERANCE:
            raise ValueError(_without_heads(
                name.removesuffix(".hook_attn_out"), "is not one affine map of its heads' "
                "outputs at each token"))  # fmt: skip
        maps.append(made)
    return maps


def _outputs(output: object) -> Tensor:
    """The floating-point tensors of a model output, flattened and joined."""
    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, Tensor)]
    return torch.cat([t.float().flatten() for t in tensors if t.is_floating_point()])


def _without_heads(where: str, why: str) -> str:
    return (
        f"{where} {why}, so its heads' outputs cannot be read one by one. Use heads=False: each "
        "block's attention is then one node."
    )
