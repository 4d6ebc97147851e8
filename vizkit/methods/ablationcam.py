"""Ablation-CAM (Desai & Ramaswamy 2020, "Ablation-CAM: Visual Explanation for Deep
Convolutional Network via Gradient-free Localization", Eq. 3): each channel's weight is the
relative drop of the target score when that channel of the activation is set to zero,
(y - y_k) / y. No gradients; one forward per channel and image, in passes sized by
``max_bytes``.
Where the layer is a block's input or output and the family's head reads the last block, the
ablated copies run from that block on (`resumed_forward`, checked to reproduce the model's
output first); elsewhere the whole model runs, the copies made in a hook on the activation.
For a token activation the channel is zeroed in the patch tokens, the ones its map shows."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.gradcam_maps import CamActivation, cam_maps, channel_cam
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.passes import images_per_pass
from ..hooks.selector import LayerSpec
from .perturbation import chunked_scores, resumed_forward, score_of
from .registry import saliency_method

__all__ = ["ablationcam"]


@saliency_method(
    "ablationcam", needs=("layer", "forwards"),
    summary="channels weighted by the score lost when each is zeroed (Desai & Ramaswamy 2020)",
)  # fmt: skip
@analysis_contract
def ablationcam(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    layer: LayerSpec | None = None, max_bytes: int | None = None,
) -> SaliencyResult:  # fmt: skip
    """Ablation-CAM maps (B, h, w) of ``layer`` (default and grid as `vizkit.gradcam`);
    ``max_bytes``: the most one forward of perturbed copies may hold (default: as much as a
    forward of the batch; `vizkit.hooks.passes`).

    Raises:
        ValueError: a target score of 0 on an image (the relative drop is undefined there).
    """

    def maps_of(found: CamActivation, hm: HookedModel, x: Tensor) -> Tensor:
        chunk = images_per_pass(hm.model, x, max_bytes, False, "ablationcam")
        weights = torch.stack([_weights(found, hm, x, target, b, chunk)
                               for b in range(len(x))])  # fmt: skip
        return channel_cam(found, weights.to(found.act.dtype))

    return cam_maps(model, x, target, layer, "ablationcam", maps_of, gradients=False,
                    max_bytes=max_bytes)  # fmt: skip


def _weights(
    found: CamActivation, hm: HookedModel, x: Tensor, target: Target, b: int, chunk: int
) -> Tensor:
    """(C,) the relative drop of image ``b``'s score when each channel is zeroed."""
    score = score_of(found.logits, target, b)
    kept = {}
    with torch.no_grad(), hm.hooks(fwd={found.layer: lambda value, *, name: kept.update(a=value)}):
        output = hm(x[b : b + 1])
    clean = score(output).float()[0]
    if clean == 0:
        raise ValueError(
            f"Image {b}'s target score is 0, so a relative drop (y - y_k) / y is undefined; "
            "explain another class or use another method."
        )
    channels = found.act.shape[1]
    tokens = found.layout is not None
    prefix = found.layout.num_prefix_tokens if tokens else 0
    current = {}

    def ablate(activation: Tensor, *, name: str) -> Tensor:
        start, stop = current["range"]
        edited = activation.clone()
        rows = torch.arange(stop - start, device=activation.device)
        channels = torch.arange(start, stop, device=activation.device)
        if tokens:  # (n, N, C): the channel in the patch tokens
            edited[rows, prefix:, channels] = 0
        elif found.channels_last:  # (n, h, w, C)
            edited[rows, :, :, channels] = 0
        else:  # (n, C, h, w)
            edited[rows, channels] = 0
        return edited

    resumed = resumed_forward(hm, found.layer, kept["a"], output)
    if resumed is not None:  # the ablated activations run from the layer on

        def ablated_copies(start: int, stop: int) -> Tensor:
            current["range"] = (start, stop)
            return ablate(kept["a"].expand(stop - start, *kept["a"].shape[1:]), name="")

        ablated = chunked_scores(resumed, ablated_copies, channels, chunk, score)
        return (clean - ablated) / clean

    def make(start: int, stop: int) -> Tensor:
        current["range"] = (start, stop)
        return x[b : b + 1].expand(stop - start, *x.shape[1:])

    with hm.hooks(fwd={found.layer: ablate}):
        ablated = chunked_scores(hm, make, channels, chunk, score)
    return (clean - ablated) / clean
