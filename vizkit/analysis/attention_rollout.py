"""Attention rollout (Abnar and Zuidema 2020) and gradient-weighted rollout (Chefer et al. 2021).

Rollout follows the maps the model really multiplies with the values: ``attn.hook_pattern`` for
ViTs, the talking-heads map after mixing (``attn.hook_pattern_mixed``) for CaiT, the refined map
(``attn.hook_pattern_refined``) for Refined-ViT; the last two are not row-stochastic, so rollout
refuses them unless ``allow_non_stochastic=True``. CaiT's class
token meets the patches only in the class-attention stage, so its rollout continues the
self-attention product through the class-attention rows (each with the residual added).
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
from torch import Tensor

from ..hooks import HookedModel
from ..hooks.heads import HeadSpec, head_option, reduce_heads
from ..hooks.inputs import check_count, check_image_batch, check_images
from ..hooks.layout import TokenLayout
from ..hooks.windows import patch_merge_matrix
from ._model import (
    applied_attention_names,
    class_attention_names,
    grid_map,
    pooling_attention_names,
    reads_class_token,
)
from .attention_maps import attention_bytes, common_layout
from .saliency_result import SaliencyResult

__all__ = [
    "check_row_stochastic",
    "class_row_relevance",
    "gradient_rollout_maps",
    "rolled_back",
    "rolled_out",
]

_MIXED = ".attn.hook_pattern_mixed"


def check_row_stochastic(pattern: Tensor, name: str, atol: float | None = None) -> None:
    """Raise a ValueError if ``pattern`` (..., Nq, N) has NaN, Inf or negative entries or rows
    not summing to 1 (summed in at least float32; a float32 or float64 map is not copied)
    within ``atol``; default: 1e-3, or the machine epsilon of a coarser dtype (a bfloat16
    softmax rounds each entry, so its rows sum to 1 within 2^-7)."""
    if atol is None:
        atol = max(1e-3, torch.finfo(pattern.dtype).eps)
    low = pattern.min().item()  # NaN if any entry is
    off = pattern.sum(-1, dtype=torch.promote_types(pattern.dtype, torch.float32)) - 1
    off = off.abs().max().item()
    if not (math.isfinite(low) and math.isfinite(off)):
        raise _non_finite(name, f"min {low:.3g}, row sums off by up to {off:.3g}")
    if low < -atol or off > atol:
        raise ValueError(
            f"{name} is not row-stochastic (min {low:.3g}, row sums off by "
            f"up to {off:.3g}), e.g. talking heads after mixing or a refined map; rollout "
            "assumes attention rows that are probabilities. Pass allow_non_stochastic=True "
            "to roll out |A| renormalized per row instead (a heuristic), or use "
            "class_attention()/gradcam()."
        )


def _non_finite(name: str, detail: str) -> ValueError:
    return ValueError(
        f"{name} holds NaN or Inf values ({detail}); rollout computes nothing on non-finite "
        "maps. Check the model's weights and the inputs (an overflow in float16, a division by "
        "a zero std)."
    )


def _discard_lowest(fused: Tensor, ratio: float) -> Tensor:
    """Zero the lowest ``ratio`` share of each map's entries (B, N, N), sparing entry [0, 0]
    (``fused`` itself where that share is no entry)."""
    flat = fused.flatten(1)
    count = int(flat.shape[1] * ratio)
    if count == 0:
        return fused
    lowest = flat.topk(count, dim=1, largest=False).indices
    dropped = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, lowest, True)
    dropped[:, 0] = False
    return flat.masked_fill(dropped, 0.0).view_as(fused)


def _with_residual(fused: Tensor) -> Tensor:
    """(A + I) / 2 with rows renormalized: (B, N, N) -> (B, N, N)."""
    mixed = fused + torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    return mixed.div_(mixed.sum(-1, keepdim=True))  # in place: `mixed` is this step's own


def _fuse(pattern: Tensor, name: str, heads, allow_non_stochastic: bool) -> Tensor:
    """One layer's maps (B, H, N, N) as one float64 map (B, N, N) for the running product."""
    if allow_non_stochastic:
        pattern = pattern.double().abs()
        sums = pattern.sum(-1, keepdim=True)  # NaN or Inf where a row holds one
        largest = sums.max().item()
        if not math.isfinite(largest):
            raise _non_finite(name, f"largest row sum of |A| {largest:.3g}")
        pattern = pattern / sums.clamp_min(1e-12)
        return reduce_heads(pattern, heads, head_dim=1)
    check_row_stochastic(pattern, name)  # the map as made, with its dtype's tolerance
    return reduce_heads(pattern, heads, head_dim=1, dtype=torch.float64)  # no float64 per head


def _query_rows(joint: Tensor, layout, class_row: bool) -> Tensor:
    """Relevance of the patches (B, Np) for the class token where the head reads it
    (``class_row``), else the mean over the patch queries (average-pooled heads)."""
    _, patch_cols = layout.split(joint, dim=-1)
    if class_row and layout.class_token:
        return patch_cols[:, 0]
    return layout.split(patch_cols, dim=1)[1].mean(1)


def rolled_out(
    hm: HookedModel, x: Tensor, heads: HeadSpec, discard_ratio: float, allow_non_stochastic: bool
) -> SaliencyResult:
    """Attention rollout's maps of images x (B, C, H, W) (`vizkit.methods.rollout.rollout`)."""
    if not 0 <= discard_ratio < 1:
        raise ValueError(f"discard_ratio must be in [0, 1); got {discard_ratio}.")
    x = check_images(hm.model, x)
    names = applied_attention_names(hm)
    layouts = _rollout_layouts(hm, names, tuple(x.shape[-2:]), "rollout")
    layout = layouts[0]
    ca_names, pool_names = class_attention_names(hm), pooling_attention_names(hm)
    steps = dict(zip(names, pairwise([layouts[0], *layouts]), strict=True))
    joint: Tensor | None = None  # the running joint attention, (B, N_here, N_first)
    done: list[str] = []
    cache: dict[str, Tensor] = {}  # the small maps read after the forward (class, pooling)

    def multiply(pattern: Tensor, *, name: str) -> None:
        """One layer's step, as its map is made: only the running product is kept."""
        nonlocal joint
        if len(done) == len(names) or names[len(done)] != name:
            raise RuntimeError(f"rollout expected the maps in the order {names}; got {name}.")
        done.append(name)
        before, here = steps[name]
        fused = _fuse(grid_map(hm, name, pattern, here), name, heads, allow_non_stochastic)
        step = _with_residual(_discard_lowest(fused, discard_ratio))
        if here != before:  # Swin's patch merging between stages
            joint = patch_merge_matrix(before.grid).to(joint.device) @ joint
        joint = step if joint is None else step @ joint

    def keep(pattern: Tensor, *, name: str) -> None:
        cache[name] = pattern.detach()

    hooks = {name: multiply for name in names} | {name: keep for name in ca_names + pool_names}
    with torch.no_grad(), hm.hooks(fwd=hooks, read_only=True):
        hm(x)
    here = layouts[-1]
    if here != layout:  # across stages: the mean over the last stage's tokens
        relevance = joint.mean(1)
    elif ca_names:  # CaiT: the class token reads the patches through class attention only
        relevance = _class_token_rollout(cache, ca_names, joint, heads)
        layout = hm.token_layout(tuple(x.shape[-2:]))
    elif pool_names:  # SigLIP: the pooling head's latent reads the tokens last
        pooled = _fuse(cache[pool_names[-1]], pool_names[-1], heads, False).mean(1)
        skipped = joint.shape[1] - pooled.shape[-1]  # prefix tokens the head does not read
        pooled = torch.cat([pooled.new_zeros(len(pooled), skipped), pooled], -1)
        relevance = layout.split(pooled.unsqueeze(1) @ joint, dim=-1)[1][:, 0]
    else:
        relevance = _query_rows(joint, layout, reads_class_token(hm))
    return SaliencyResult(
        maps=layout.to_grid(relevance.float()),
        method="rollout",
        image_size=tuple(x.shape[-2:]),
        options={
            "heads": head_option(heads),
            "discard_ratio": discard_ratio,
            "allow_non_stochastic": allow_non_stochastic,
            "maps": names + ca_names + pool_names[-1:],
        },
        layout=layout,
    )


def _rollout_layouts(hm: HookedModel, names: list[str], image_size, method: str) -> list:
    """The token layout of each map rollout multiplies: one layout, or (Swin) the stage grids
    joined by 2 x 2 patch merging. Refuses models whose token mixing rollout cannot follow (maps
    over pooled keys or channels, stages joined by convolutions or pooling)."""
    other = sorted({hm.tap(n).kind for n in hm.hook_names() if hm.tap(n).kind in _UNROLLABLE})
    if other:
        raise ValueError(
            f"{method} multiplies every token-mixing layer's N x N map, but "
            f"{type(hm.model).__name__} also mixes tokens through {', '.join(other)} attention "
            "(pooled keys or channels), which has no such map; skipping it would give a wrong "
            "answer. Use gradcam(), or attention() for the maps themselves."
        )
    layouts = [hm.token_layout(image_size, name) for name in names]
    merges = hm.family is not None and hm.family.merges_patches and method == "rollout"
    if len(set(layouts)) > 1 and merges and _halving(layouts):
        return layouts
    common_layout(
        hm, names, image_size,
        fix=f"{method} would have to follow the tokens through convolutions or pooling between "
        "stages; use gradcam(), or attention(layers=[...]) within one stage.",
    )  # fmt: skip
    return layouts


def _halving(layouts) -> bool:
    """Whether each change of grid halves it (rounded up), with no prefix tokens."""
    steps = [(a, b) for a, b in pairwise(layouts) if a != b]
    return all(
        not a.num_prefix_tokens
        and not b.num_prefix_tokens
        and b.grid == tuple(-(-g // 2) for g in a.grid)
        for a, b in steps
    )


_UNROLLABLE = ("pooled", "channel", "cross")


def _class_token_rollout(cache, ca_names: list[str], joint: Tensor, heads) -> Tensor:
    """Continue rollout through class attention: (B, Np) relevance of the input patches.

    The class token's relevance r lives on [class token, input patches]; the patch tokens'
    rows are [0 | joint]. Each class-attention row a (over [class token, patches]) gets the
    residual added, a' = (a + e_0) / 2 renormalized, and r <- a'_0 r + a'_patches [0 | joint].
    """
    batch, patches = joint.shape[0], joint.shape[-1]
    tokens = torch.cat([joint.new_zeros(batch, patches, 1), joint], -1)  # (B, Np, 1 + Np)
    r = joint.new_zeros(batch, 1 + patches)
    r[:, 0] = 1
    for name in ca_names:
        row = _fuse(cache[name], name, heads, False)[:, 0]  # (B, 1 + Np)
        row = torch.cat([row[:, :1] + 1, row[:, 1:]], -1) / 2  # residual: + e_0, rows sum to 1
        r = row[:, :1] * r + (row[:, 1:, None] * tokens).sum(1)
    return r[:, 1:]


def gradient_rollout_maps(
    hm: HookedModel, x: Tensor, max_bytes: int, method: str, held: int = 1
) -> tuple[list[str], TokenLayout]:
    """The maps a gradient-weighted rollout of ``x`` multiplies (one per block) and their token
    layout. Refuses models whose class token takes no part in self-attention, and batches whose
    maps (``held`` copies of each layer's, plus one gradient) take more than ``max_bytes``."""
    check_image_batch(hm.model, x)  # the size check below reads no values; check_images does
    names = applied_attention_names(hm)
    last = hm.token_layout(tuple(x.shape[-2:]), names[-1])
    if any(n.endswith(_MIXED) for n in names) or not last.class_token:
        raise ValueError(
            f"{method} needs self-attention over a class token (ViT/DeiT); this model's "
            "class token does not take part in self-attention (CaiT) or it has none. Use "
            "class_attention(), rollout(...) or gradcam()."
        )
    layout = _rollout_layouts(hm, names, tuple(x.shape[-2:]), method)[0]
    max_bytes = check_count("max_bytes", max_bytes)
    size = held * attention_bytes(hm, x, names) + attention_bytes(hm, x, names[-1:])
    if size > max_bytes:
        raise ValueError(
            f"{method} differentiates through {len(names)} attention maps, which the graph "
            f"holds until the backward reaches them, and one gradient at a time: "
            f"{size / 2**20:.1f} MiB for a batch of {len(x)} (B x H x N x N floats per layer), "
            f"above max_bytes={max_bytes / 2**20:.1f} MiB. Pass a smaller batch (the maps are "
            "per image) or a larger max_bytes."
        )
    return names, layout


def rolled_back(relevance: Tensor | None, weighted: Tensor) -> Tensor:
    """One layer of R = (I + W_L) ... (I + W_1), built from the last layer back: ``weighted``
    (B, H, N, N) is that layer's weighted map, W its positive part averaged over heads."""
    weighted = weighted.clamp_min(0).mean(1).double()  # (B, N, N)
    if relevance is None:
        eye = torch.eye(weighted.shape[-1], dtype=weighted.dtype, device=weighted.device)
        return eye + weighted
    return relevance + relevance @ weighted


def class_row_relevance(hm: HookedModel, relevance: Tensor, layout: TokenLayout) -> Tensor:
    """The patches' relevance on the grid (B, gh, gw): R's class-token row where the head reads
    the class token, else the mean over the patch rows."""
    return layout.to_grid(_query_rows(relevance, layout, reads_class_token(hm)).float())
