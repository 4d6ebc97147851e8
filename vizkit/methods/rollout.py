"""Attention rollout (Abnar and Zuidema 2020, "Quantifying Attention Flow in Transformers",
Sec. 3): each layer's attention, heads fused and the residual added, multiplied over the layers
(`vizkit.analysis.attention_rollout`: which maps, and the models whose token mixing it follows)."""

from __future__ import annotations

from torch import Tensor, nn

from ..analysis.attention_rollout import rolled_out
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.heads import HeadSpec
from .registry import saliency_method

__all__ = ["rollout"]


@saliency_method(
    "rollout", needs=("attention",), targets=False, default=True,
    summary="attention maps multiplied over the layers (Abnar & Zuidema 2020)",
)  # fmt: skip
@analysis_contract(videos=True)
def rollout(
    model: nn.Module | HookedModel,
    x: Tensor,
    heads: HeadSpec = "mean",
    discard_ratio: float = 0.0,
    allow_non_stochastic: bool = False,
) -> SaliencyResult:
    """Attention rollout: per layer fuse the heads, drop the weakest entries, add the identity
    for the residual, renormalize rows, and multiply over layers (last layer on the left).

    Args:
        model: a ViT-family model or HookedModel.
        x: image batch (B, C, H, W), or a video model's clips (B, T, C, H, W).
        heads: how each layer's heads are fused: "mean", "max", "min", one head's index
            or a list of heads to average (`vizkit.hooks.reduce_heads`).
        discard_ratio: share of each fused map's lowest entries set to 0 (the class token's
            self-weight is kept), as in vit-explain.
        allow_non_stochastic: roll out maps that are not row-stochastic (CaiT's talking heads)
            by replacing each head's map with |A| renormalized per row first. Off: they are
            refused with a ValueError.

    Returns:
        `SaliencyResult` (B, gh, gw) (for clips (B, T', gh, gw)): the class token's row of the joint
            attention over the patches where the head reads the class token
            (``global_pool="token"``); for models with an attention-pooling head (SigLIP), the
            head's map (latents and heads fused) times the joint attention; otherwise the mean over
            patch queries. Window attention (Swin, Twins) is rolled out in image space; across
            Swin's stages each 2 x 2 patch merging passes the mean of its four tokens' relevance on,
            and the map is the mean over the last stage's tokens on the first stage's grid. An odd
            grid (7 -> 4 at 112 px) is padded by the model, so its edge tokens are merged from fewer
            real tokens, which then carry their merged token's whole relevance: expect a brighter
            last row and column there (none at 224 px: 56, 28, 14, 7).

    Raises:
        ValueError: models whose tokens also mix through maps rollout cannot multiply (pooled
            keys, channel attention, cross-attention between branches) or whose stages are
            joined by convolutions or pooling (PiT, MViTv2, MaxViT); non-row-stochastic maps.
    """
    return rolled_out(as_hooked(model), x, heads, discard_ratio, allow_non_stochastic)
