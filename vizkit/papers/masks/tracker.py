"""The learned-masks tracker of training histories (GMM/ELM masks per epoch), registered as
recipe ``track`` name ``"masks"``."""

from __future__ import annotations

from torch import Tensor, nn

from ...train.callbacks import TRACKERS
from .analysis import gmm_parameters, learned_masks, mask_locality, radial_profile
from .masked_attention import MaskedAttention

__all__ = ["LearnedMasksTracker"]


class LearnedMasksTracker:
    """The learned attention masks: ``{"masks": {layer: {"alpha": [[...]], "sigma": [[...]]}}}``
    for GMM layers (K x Hm); for ELM layers their radial profile (the full Np x Np matrices
    would be 4096 numbers per layer and epoch for an 8 x 8 grid; the checkpoint holds the last)
    ``{"masks": {layer: {"distance": [...], "profile": [...], "extroversion": v}}}``."""

    def __call__(self, model: nn.Module, epoch: int, eval_batch: Tensor) -> dict:
        if not any(isinstance(m, MaskedAttention) for m in model.modules()):
            return {}
        try:
            params = gmm_parameters(model)
        except ValueError:  # element-wise masks
            return {
                "masks": {n: _elm_summary(m[0], model) for n, m in learned_masks(model).items()}
            }
        return {"masks": {n: {k: v.tolist() for k, v in p.items()} for n, p in params.items()}}


def _elm_summary(mask: Tensor, model: nn.Module) -> dict:
    grid = tuple(model.patch_embed.grid_size)
    distance, profile = radial_profile(mask, grid)
    return {
        "distance": [round(d, 4) for d in distance.tolist()],
        "profile": [round(v, 5) for v in profile.tolist()],
        "extroversion": mask_locality(mask, grid).extroversion.item(),
    }


TRACKERS["masks"] = LearnedMasksTracker
