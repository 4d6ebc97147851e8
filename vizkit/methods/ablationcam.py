"""Ablation-CAM (Desai & Ramaswamy 2020, "Ablation-CAM: Visual Explanation for Deep
Convolutional Network via Gradient-free Localization", Eq. 3): each channel's weight is the
relative drop of the target score when that channel of the activation is set to zero,
(y - y_k) / y. No gradients; one forward per channel and image, in passes sized by
``max_bytes``.
One clean run of the batch (`vizkit.analysis.resume.layer_run`) gives each image's score y and
its activation at the layer. Where that run proves the forward from the layer's block on, the
ablated copies run from there; elsewhere the whole model runs, the copies made in a hook on the
activation. A batch of one image (or of identical images) cannot prove that path alone: its
clean run is made again with a companion image, the first image negated (`_clean_run`). For a
token activation the channel is zeroed in the patch tokens, the ones its map shows: for a video
model's clips (B, T, C, H, W), in every space-time token of the clip (T' token frames of
gh x gw), so the maps are (B, T', gh, gw)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..analysis.gradcam_maps import CamActivation, cam_maps, channel_cam
from ..analysis.resume import UNDECIDED, LayerRun, ResumedForward, contracted_layer_run
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.passes import images_per_pass
from ..hooks.scores import is_score_target, model_logits
from ..hooks.selector import LayerSpec
from .perturbation import chunked_scores, score_of
from .registry import saliency_method

__all__ = ["ablationcam"]


@saliency_method(
    "ablationcam", needs=("layer", "forwards"),
    summary="channels weighted by the score lost when each is zeroed (Desai & Ramaswamy 2020)",
)  # fmt: skip
@analysis_contract(videos=True)
def ablationcam(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    layer: LayerSpec | None = None, max_bytes: int | None = None,
) -> SaliencyResult:  # fmt: skip
    """Ablation-CAM maps (B, h, w) of ``layer`` (default and grid as `vizkit.gradcam`) for images
    x (B, C, H, W); for a video model's clips (B, T, C, H, W), (B, T', gh, gw) on its token
    frames. ``max_bytes``: the most one forward of perturbed copies (images or clips) may hold
    (default: as much as a forward of the batch; `vizkit.hooks.passes`).

    Raises:
        ValueError: a target score of 0 on an image (the relative drop is undefined there).
    """

    def maps_of(found: CamActivation, hm: HookedModel, x: Tensor) -> Tensor:
        chunk = images_per_pass(hm.model, x, max_bytes, False, "ablationcam")
        run = _clean_run(hm, x, found.layer, _scored(target))
        weights = torch.stack([_weights(found, hm, x, target, run, b, chunk)
                               for b in range(len(x))])  # fmt: skip
        return channel_cam(found, weights.to(found.act.dtype))

    return cam_maps(model, x, target, layer, "ablationcam", maps_of, gradients=False,
                    max_bytes=max_bytes)  # fmt: skip


def _clean_run(
    hm: HookedModel, x: Tensor, layer: str, read: Callable[[object], object]
) -> LayerRun:
    """The clean run (`vizkit.analysis.resume.layer_run`) at ``layer`` of images x
    (B, C, H, W) or clips (B, T, C, H, W). Its proof of the path from there needs two different
    images, which a batch of one image or of identical images lacks (`UNDECIDED`): there, the
    run of x and a companion, -x[0] (row B, which no image reads)."""
    run = contracted_layer_run(hm, x, layer, read)
    if run.why != UNDECIDED:
        return run
    return contracted_layer_run(hm, torch.cat([x, -x[:1]]), layer, read)


def _scored(target: Target) -> Callable[[object], object]:
    """What of the model's output the score reads, so what the resumed path must give: the
    whole output for a score target (it may read any part of it), else the logits."""
    return (lambda output: output) if is_score_target(target) else model_logits


def _weights(
    found: CamActivation, hm: HookedModel, x: Tensor, target: Target, run: LayerRun, b: int,
    chunk: int,
) -> Tensor:  # fmt: skip
    """(C,) the relative drop of image ``b``'s score when each channel is zeroed; ``run``: the
    clean run of the batch x at the layer."""
    score = score_of(found.logits, target, b)
    clean = score(run.output).float()[b]  # row b of the batch's output, scored as image b's
    if clean == 0:
        raise ValueError(
            f"Image {b}'s target score is 0, so a relative drop (y - y_k) / y is undefined; "
            "explain another class or use another method."
        )
    if run.resumed is not None:
        ablated = _resumed_scores(found, run.resumed, run.stream[b : b + 1], score, chunk)
    else:
        ablated = _whole_model_scores(found, hm, x[b : b + 1], score, chunk)
    return (clean - ablated) / clean


def _resumed_scores(
    found: CamActivation, resumed: ResumedForward, stream: Tensor, score: Callable, chunk: int
) -> Tensor:
    """(C,) the score with each channel of the image's activation ``stream`` (1, N, C) zeroed,
    the copies run from the layer on (the model held by `ablationcam`'s contract)."""

    def copies(start: int, stop: int) -> Tensor:
        return _zeroed(found, stream.expand(stop - start, *stream.shape[1:]), start)

    return chunked_scores(resumed.forward, copies, found.act.shape[1], chunk, score)


def _whole_model_scores(
    found: CamActivation, hm: HookedModel, image: Tensor, score: Callable, chunk: int
) -> Tensor:
    """(C,) the score with each channel zeroed, the copies of ``image`` (1, C, H, W) (a clip:
    (1, T, C, H, W)) run through the whole model, the channel zeroed in a hook on the activation."""
    first = {}

    def copies(start: int, stop: int) -> Tensor:
        first["channel"] = start
        return image.expand(stop - start, *image.shape[1:])

    def ablate(activation: Tensor, *, name: str) -> Tensor:
        return _zeroed(found, activation, first["channel"])

    with hm.hooks(fwd={found.layer: ablate}):
        return chunked_scores(hm, copies, found.act.shape[1], chunk, score)


def _zeroed(found: CamActivation, activation: Tensor, start: int) -> Tensor:
    """n copies of one image's activation, (n, ...) as the model holds it, copy i with channel
    ``start + i`` zeroed (in the patch tokens of a token activation)."""
    edited = activation.clone()
    rows = torch.arange(len(activation), device=activation.device)
    channels = rows + start
    if found.layout is not None:  # (n, N, C): the channel in the patch tokens
        edited[rows, found.layout.num_prefix_tokens :, channels] = 0
    elif found.channels_last:  # (n, h, w, C)
        edited[rows, :, :, channels] = 0
    else:  # (n, C, h, w)
        edited[rows, channels] = 0
    return edited
