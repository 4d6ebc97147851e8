"""CaiT analyses (Touvron et al. 2021, "Going deeper with Image Transformers"): Fig. 7's images
shown in grey, modulated by the first class-attention layer's saliency, and the talking-heads
mixing matrices (Sec. 2, following Shazeer et al. 2020)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...analysis.result import Result
from ...analysis.saliency_result import SaliencyResult, min_max
from ...hooks.inputs import unwrap_model

__all__ = ["TalkingHeadsMixing", "modulated_gray", "talking_heads"]


@dataclass(repr=False)
class TalkingHeadsMixing(Result):
    """The talking-heads mixing of every self-attention block that has it.

    Attributes:
        layers: the blocks' attention modules (``blocks.{i}.attn``).
        pre_softmax: (L, H, H) P_l, mixing the heads' logits; rows = output head.
        post_softmax: (L, H, H) P_w, mixing the heads' softmax maps.
    """

    layers: list[str]
    pre_softmax: Tensor
    post_softmax: Tensor


def talking_heads(model: nn.Module) -> TalkingHeadsMixing:
    """The talking-heads matrices of ``model`` (CaiT's ``proj_l``/``proj_w``), read from its
    parameters; a ValueError for a model without talking heads."""
    model = unwrap_model(model)
    blocks = [(i, b.attn) for i, b in enumerate(getattr(model, "blocks", ()))
              if hasattr(b.attn, "proj_l")]  # fmt: skip
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no talking-heads attention (proj_l/proj_w).")
    return TalkingHeadsMixing(
        layers=[f"blocks.{i}.attn" for i, _ in blocks],
        pre_softmax=torch.stack([a.proj_l.weight.detach().cpu().clone() for _, a in blocks]),
        post_softmax=torch.stack([a.proj_w.weight.detach().cpu().clone() for _, a in blocks]),
    )


_GRAY = (0.299, 0.587, 0.114)  # ITU-R BT.601 luma


def modulated_gray(
    saliency: SaliencyResult, x: Tensor, mean: tuple[float, ...], std: tuple[float, ...]
) -> SaliencyResult:
    """CaiT Fig. 7: upsample the map (bilinear), min-max it per image and multiply the grey
    image with it (the paper shows the result with the cividis colormap).

    Args:
        saliency: e.g. `class_attention` of CA layer 0 (head mean).
        x: the normalized image batch (B, 3, H, W) it was computed on.
        mean, std: the normalization of ``x`` (``model.pretrained_cfg["mean"/"std"]``).

    Returns:
        `SaliencyResult` with pixel maps (B, H, W) in [0, 1] and ``extras["gray"]``.
    """
    if x.ndim != 4 or x.shape[1] != 3 or len(x) != len(saliency.maps):
        raise ValueError(
            f"x must be the (B={len(saliency.maps)}, 3, H, W) batch the saliency was computed "
            f"on; got {tuple(x.shape)}."
        )
    if tuple(x.shape[-2:]) != tuple(saliency.image_size):
        raise ValueError(
            f"Images are {tuple(x.shape[-2:])} but the saliency was computed for "
            f"{tuple(saliency.image_size)}."
        )
    mean_, std_ = (
        torch.tensor(v, dtype=x.dtype, device=x.device)[:, None, None] for v in (mean, std)
    )
    rgb = (x * std_ + mean_).clamp(0, 1)
    gray = torch.einsum("bchw,c->bhw", rgb, torch.tensor(_GRAY, dtype=x.dtype, device=x.device))
    strength = min_max(saliency.upsample("bilinear").to(x.device, x.dtype))
    return SaliencyResult(
        maps=gray * strength,
        method=f"{saliency.method}+modulated_gray",
        image_size=saliency.image_size,
        options={**saliency.options, "upsample": "bilinear", "normalize": "min-max"},
        targets=saliency.targets,
        extras={"gray": gray, "strength": strength},
    )
