"""Eigen-CAM (Muhammad & Yeasin 2020, "Eigen-CAM: Class Activation Map using Principal
Components", Eq. 6): the activation (positions x channels, centred over the positions) projected
on its first right singular vector; class-agnostic, no gradients. The sign of a singular vector is
arbitrary, so it is chosen to make the projection's largest-magnitude entry positive (the
convention of scikit-learn's ``svd_flip``), and the positive part kept.

The projection A v1 = s1 u1 comes from the top eigenpair of the smaller Gram matrix, A A^T
(positions x positions) or A^T A (channels x channels), in float64: the singular value
decomposition's first component without the rest of it."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.gradcam_maps import CamActivation, cam_maps
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel
from ..hooks.contract import analysis_contract
from ..hooks.selector import LayerSpec
from .registry import saliency_method

__all__ = ["eigencam"]


@saliency_method(
    "eigencam", needs=("layer",), targets=False,
    summary="first principal component of the activation (Muhammad & Yeasin 2020)",
)  # fmt: skip
@analysis_contract(videos=True)
def eigencam(
    model: nn.Module | HookedModel, x: Tensor, layer: LayerSpec | None = None
) -> SaliencyResult:
    """Eigen-CAM maps (B, h, w) of ``layer`` (default and grid as `vizkit.gradcam`)."""
    return cam_maps(model, x, None, layer, "eigencam", _maps, gradients=False, class_agnostic=True)


def _maps(found: CamActivation, hm: HookedModel, x: Tensor) -> Tensor:
    batch, channels, h, w = found.act.shape
    positions = found.act.flatten(2).transpose(1, 2)  # (B, hw, C)
    centred = positions - positions.mean(1, keepdim=True)
    projection = _first_component(centred)  # (B, hw)
    peak = projection.gather(1, projection.abs().argmax(1, keepdim=True))  # (B, 1)
    sign = torch.where(peak < 0, -1.0, 1.0).to(projection)
    return (projection * sign).clamp_min(0).view(batch, h, w)


def _first_component(a: Tensor) -> Tensor:
    """(B, n) the projection a v1 = s1 u1 of each (n, C) matrix of ``a`` (B, n, C) on its first
    right singular vector (sign arbitrary), from the top eigenpair of the smaller Gram."""
    if a.shape[1] <= a.shape[2]:
        values, vectors = torch.linalg.eigh(a @ a.transpose(1, 2))  # (B, n, n): u1, s1^2
        return vectors[..., -1] * values[..., -1:].clamp_min(0).sqrt()
    _, vectors = torch.linalg.eigh(a.transpose(1, 2) @ a)  # (B, C, C): v1
    return (a @ vectors[..., -1:])[..., 0]
