"""Average Drop and Increase in Confidence (Chattopadhyay et al. 2018, "Grad-CAM++", Sec. 5.1):
the model sees its input times the saliency map (scaled to [0, 1] per image and upsampled to the
image), and the target class's softmax probability O_c is compared with that on the whole
image, Y_c. Per image: the drop max(0, Y_c - O_c) / Y_c and whether O_c > Y_c; the paper
reports their means in percent. On normalized images the product dims each pixel toward the
normalization's mean (pytorch-grad-cam multiplies the normalized input too)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.saliency_result import SaliencyResult, min_max, saliency_maps
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_images
from ..hooks.scores import model_logits, target_indices
from .faithfulness import batch_images
from .registry import ScoredBatch, metric

__all__ = ["average_drop", "confidence_change", "increase_in_confidence"]


def confidence_change(
    model: HookedModel, x: Tensor, saliency: SaliencyResult | Tensor, target: Target,
    batch_size: int | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(B,) the target class's probability on the images and on the images times their maps,
    the maps checked and scaled to [0, 1] per image (constant maps refused)."""
    x = check_images(model.model, x)
    maps = saliency_maps(saliency, len(x), tuple(x.shape[-2:]))
    weights = min_max(maps.float().to(x.device))[:, None]
    if tuple(weights.shape[-2:]) != tuple(x.shape[-2:]):
        weights = F.interpolate(weights, size=tuple(x.shape[-2:]), mode="bilinear")
    size = batch_images(batch_size, x, model.model)
    clean, masked = [], []
    with torch.no_grad():
        for start in range(0, len(x), size):
            part = slice(start, start + size)
            clean.append(model_logits(model(x[part])).float().softmax(-1))
            dimmed = x[part] * weights[part].to(x.dtype)
            masked.append(model_logits(model(dimmed)).float().softmax(-1))
    clean, masked = torch.cat(clean), torch.cat(masked)
    index = target_indices(clean, target)[:, None]
    return clean.gather(1, index)[:, 0], masked.gather(1, index)[:, 0]


@analysis_contract
def average_drop(
    model: nn.Module | HookedModel, x: Tensor, saliency: SaliencyResult | Tensor,
    target: Target = None, batch_size: int | None = None,
) -> Tensor:  # fmt: skip
    """(B,) max(0, Y_c - O_c) / Y_c per image (lower: the map keeps what the class needs);
    ``target``: a class, B classes, or None for the prediction on the whole image; ``saliency``:
    a `SaliencyResult` or maps (B, h, w) tiling the images; ``batch_size``: images per forward
    (None: as many as hold 2**19 pixels)."""
    full, masked = confidence_change(model, x, saliency, target, batch_size)
    return (full - masked).clamp_min(0) / full


@analysis_contract
def increase_in_confidence(
    model: nn.Module | HookedModel, x: Tensor, saliency: SaliencyResult | Tensor,
    target: Target = None, batch_size: int | None = None,
) -> Tensor:  # fmt: skip
    """(B,) 1.0 where O_c > Y_c (the map alone is more convincing than the image), else 0.0;
    arguments as `average_drop`."""
    full, masked = confidence_change(model, x, saliency, target, batch_size)
    return (masked > full).float()


@metric("average_drop", higher=False, scores=False, perturbs=True,
        summary="drop in the class's probability on the image times its map "
                "(Chattopadhyay et al. 2018)")  # fmt: skip
def _average_drop(batch: ScoredBatch) -> Tensor:
    return average_drop(batch.hm, batch.x, batch.result, batch.targets)


@metric("increase_in_confidence", higher=True, scores=False, perturbs=True,
        summary="whether the image times its map raises the class's probability "
                "(Chattopadhyay et al. 2018)")  # fmt: skip
def _increase_in_confidence(batch: ScoredBatch) -> Tensor:
    return increase_in_confidence(batch.hm, batch.x, batch.result, batch.targets)
