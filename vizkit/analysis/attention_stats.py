"""Per-head statistics of attention patterns.

Every function takes post-softmax patterns ``(..., Nq, N)`` whose key axis holds the prefix tokens
followed by the gh x gw patches (see `TokenLayout`), and returns one value per head ``(...)``:
the statistic averaged over the queries.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..hooks import TokenLayout
from .entropy import normalized_entropy

__all__ = [
    "absolute_rows",
    "head_divergence",
    "head_diversity",
    "kl_to_uniform",
    "locality_mass",
    "mean_attention_distance",
    "negative_mass",
    "patch_distances",
    "query_entropy",
    "row_sum_deviation",
    "self_mass",
]


def query_entropy(pattern: Tensor) -> Tensor:
    """Normalized entropy over keys, averaged over queries: (..., Nq, N) -> (...)."""
    return normalized_entropy(pattern).mean(-1)


def kl_to_uniform(pattern: Tensor) -> Tensor:
    """KL(pattern row || uniform over the N keys) in nats, averaged over queries:
    (..., Nq, N) -> (...). Equals log N times (1 - normalized entropy)."""
    keys = pattern.shape[-1]
    return math.log(keys) * (1 - normalized_entropy(pattern)).mean(-1)


def patch_distances(layout: TokenLayout, patch_size: tuple[int, int] = (1, 1)) -> Tensor:
    """Euclidean distance between patch centres (Np, Np), in units of ``patch_size`` (rows, cols):
    (1, 1) gives patches, the model's patch size gives pixels. In a video, the distance within
    the frame (a patch's own position in another frame is at 0; `frame_distances` the rest)."""
    rows, cols = layout.patch_coordinates()[:, 1:].unbind(-1)
    centres = torch.stack([rows * patch_size[0], cols * patch_size[1]], -1)
    return torch.cdist(centres.double(), centres.double())


def frame_distances(layout: TokenLayout) -> Tensor:
    """|Δt| between the token frames of the patches (Np, Np) of a video's ``layout``."""
    frames = layout.patch_coordinates()[:, 0].double()
    return (frames[:, None] - frames).abs()


def _patch_to_patch(pattern: Tensor, layout: TokenLayout) -> Tensor:
    """Rows of the patch queries over the patch keys, renormalized: (..., N, N) -> (..., Np, Np).

    Prefix tokens have no position, so distance-based statistics leave them out.
    """
    if pattern.shape[-2] != layout.num_tokens:
        raise ValueError(
            f"Distance statistics need the full pattern (..., {layout.num_tokens}, "
            f"{layout.num_tokens}) with every patch query; got {tuple(pattern.shape)} (a "
            "single query row, e.g. query='cls', has no position)."
        )
    _, patches = layout.split(pattern.double(), dim=-2)
    _, keys = layout.split(patches, dim=-1)
    return keys / keys.sum(-1, keepdim=True).clamp_min(1e-12)


def mean_attention_distance(
    pattern: Tensor, layout: TokenLayout, patch_size: tuple[int, int] = (1, 1)
) -> Tensor:
    """Attention-weighted distance between query and key patches (Dosovitskiy et al. 2021,
    Fig. 7), averaged over patch queries: (..., N, N) -> (...).

    Units: patches by default; pass the model's patch size for pixels.
    """
    weights = _patch_to_patch(pattern, layout)
    distance = patch_distances(layout, patch_size).to(weights.device)
    return (weights * distance).sum(-1).mean(-1).to(pattern.dtype)


def mean_frame_distance(pattern: Tensor, layout: TokenLayout) -> Tensor:
    """Attention-weighted |Δt| in token frames between query and key patches of a video,
    averaged over patch queries: (..., N, N) -> (...) (0: every patch attends within its own
    frame)."""
    weights = _patch_to_patch(pattern, layout)
    distance = frame_distances(layout).to(weights.device)
    return (weights * distance).sum(-1).mean(-1).to(pattern.dtype)


def self_mass(pattern: Tensor, layout: TokenLayout) -> Tensor:
    """Attention a patch pays to itself, averaged over patch queries: (..., N, N) -> (...)
    (low values: "extroversion", the GMM paper's Fig. 3)."""
    return _patch_to_patch(pattern, layout).diagonal(dim1=-2, dim2=-1).mean(-1).to(pattern.dtype)


def locality_mass(pattern: Tensor, layout: TokenLayout, radius: int = 1) -> Tensor:
    """Share of a patch query's attention on the patches within ``radius`` rows and columns of
    it (itself included; radius 1 = its 3x3 neighbourhood; in a video, in any frame), averaged
    over patch queries: (..., N, N) -> (...)."""
    weights = _patch_to_patch(pattern, layout)
    rows, cols = layout.patch_coordinates()[:, 1:].unbind(-1)
    near = ((rows[:, None] - rows).abs() <= radius) & ((cols[:, None] - cols).abs() <= radius)
    return (weights * near.to(weights.device)).sum(-1).mean(-1).to(pattern.dtype)


def head_divergence(pattern: Tensor, head_dim: int = -3) -> Tensor:
    """Pairwise Jensen-Shannon divergence between heads (nats, in [0, log 2]), averaged over
    queries: (..., H, Nq, N) -> (..., H, H). Computed in float64 one (H, Nq, N) block at a time,
    so the (H, H, Nq, N) pairs never exist for more than one image and layer."""
    p = pattern.movedim(head_dim, -3)
    heads = p.shape[-3]
    blocks = [_js_pairs(block.double()) for block in p.reshape(-1, *p.shape[-3:])]
    out = torch.stack(blocks) if blocks else torch.zeros(0, heads, heads, dtype=torch.float64)
    return out.reshape(*p.shape[:-3], heads, heads).to(pattern.dtype)


def _js_pairs(p: Tensor) -> Tensor:
    """JS divergence of every pair of heads' rows, averaged over queries: (H, Nq, N) -> (H, H),
    as H(m) - (H(a) + H(b)) / 2 with m the pair's mean; each unordered pair once."""
    heads = len(p)
    a, b = torch.triu_indices(heads, heads, 1, device=p.device)
    negative_entropy = torch.special.xlogy(p, p).sum(-1)  # (H, Nq)
    m = (p[a] + p[b]) / 2  # (pairs, Nq, N)
    halves = (negative_entropy[a] + negative_entropy[b]) / 2
    js = (halves - torch.special.xlogy(m, m).sum(-1)).mean(-1)
    out = p.new_zeros(heads, heads)
    out[a, b] = js
    out[b, a] = js
    return out


def head_diversity(pattern: Tensor, head_dim: int = -3) -> Tensor:
    """Mean Jensen-Shannon divergence of each head to the other heads: (..., H, Nq, N) ->
    (..., H). 0 when all heads attend alike; at most log 2."""
    heads = pattern.shape[head_dim]
    if heads < 2:
        raise ValueError("Head diversity needs at least 2 heads; the pattern has 1.")
    return head_divergence(pattern, head_dim).sum(-1) / (heads - 1)


def absolute_rows(maps: Tensor) -> Tensor:
    """|A| with each row renormalized to sum to 1: signed maps (..., Nq, N) as distributions
    (Refiner, Zhou et al. 2021, § 5: refined maps have negative weights); softmax maps are returned
    unchanged."""
    magnitude = maps.abs()
    return magnitude / magnitude.sum(-1, keepdim=True).clamp_min(1e-12)


def negative_mass(maps: Tensor) -> Tensor:
    """Share of each row's |A| on negative entries, averaged over queries: (..., Nq, N) -> (...).
    0 for softmax maps."""
    return (maps.clamp_max(0).abs().sum(-1) / maps.abs().sum(-1).clamp_min(1e-12)).mean(-1)


def row_sum_deviation(maps: Tensor) -> Tensor:
    """|row sum - 1|, averaged over queries: (..., Nq, N) -> (...). 0 for softmax maps."""
    return (maps.sum(-1) - 1).abs().mean(-1)
