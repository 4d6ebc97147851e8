"""LeGrad (Bousselham et al. 2024, "LeGrad: An Explainability Method for Vision Transformers via
Feature Formation Sensitivity", Sec. 3): for each self-attention layer l, the model's head read
on that block's output gives a score s^l (what the layer would predict); the positive part of
its gradient with respect to the layer's own post-softmax map A^l, averaged over heads and
queries, is the layer's relevance of each key token; the map is the mean over layers of the
patch keys' relevance. Attention values are not multiplied in. The head is the model's own,
pooling heads included (SigLIP's attention pooling, Swin's average pooling)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..analysis._model import attention_names, grid_map
from ..analysis.attention_maps import common_layout, stage_layers
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import check_images
from ..hooks.scores import (
    call_target,
    explained_classes,
    is_dense,
    is_score_target,
    model_logits,
    output_rows,
    target_indices,
)
from ..hooks.selector import LayerSpec
from .registry import saliency_method

__all__ = ["legrad"]


@saliency_method(
    "legrad", needs=("attention", "gradients"),
    summary="each layer's own score differentiated at its attention map (Bousselham et al. 2024)",
)  # fmt: skip
@analysis_contract(videos=True)
def legrad(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    layers: LayerSpec | None = None,
) -> SaliencyResult:  # fmt: skip
    """LeGrad maps (B, gh, gw) over the self-attention ``layers`` (default: every layer over
    the last block's tokens, i.e. the last stage of a hierarchical model such as Swin). Window
    maps are put back on the stage grid, each key's relevance the mean over its window's
    queries.

    Each layer's score is the model's head read on that layer's block output: the family's
    readout (`FamilyLayout.readout`) where it gives one, else the model's own forward again
    with its last block's output replaced by that block's (one more forward per layer, so any
    head, pooling or classifier, is the model's own).

    Raises:
        ValueError: layers over other tokens than the last block's (the head cannot read
            them), maps vizkit recomputes beside the model's attention (no gradient), or a
            dense model (a decoder, not a head, makes its output).
    """
    hm = as_hooked(model)
    x = check_images(hm.model, x)
    if hm.family is None:
        raise ValueError(
            f"LeGrad reads the model's head on every layer's tokens, and vizkit knows no "
            f"blocks of {type(hm.model).__name__}; use a CAM or attnlrp."
        )
    if is_dense(hm.model):
        raise ValueError(
            f"LeGrad reads the model's head on every layer's tokens as if they were the last "
            f"block's; {type(hm.model).__name__}'s dense decoder makes its output instead of a "
            "head (DPT's reads several layers' tokens at once, a promptable model's joins the "
            "prompt), so no layer has a head of its own. Use gradcam, attnlrp or "
            "integrated_gradients with the same target."
        )
    image_size = tuple(x.shape[-2:])
    if layers is None:
        layers = stage_layers(hm, image_size, -1)
    names = attention_names(hm, layers)
    layout = common_layout(hm, names, image_size, fix="Pass layers= of one stage.")
    known = set(hm.hook_names())
    posts = [_block_output(name, known) for name in names]
    final = f"{hm.family.blocks[-1].path}.hook_resid_post"  # the model's last block
    captured: dict[str, Tensor] = {}

    def keep(value: Tensor, *, name: str) -> None:
        captured[name] = value

    x = x.detach().requires_grad_(True)  # the graph starts at the images, parameters frozen
    with frozen_parameters(hm.model), torch.enable_grad():
        with hm.hooks(fwd={n: keep for n in dict.fromkeys([*names, *posts, final])}):
            logits = hm(x)
        readout = _readout(hm, x.detach(), final, captured[final], logits)
        score_of = _scorer(logits, target)  # the class indices resolved once, for every layer
        relevance = []
        for index, (name, post) in enumerate(zip(names, posts, strict=True)):
            if captured[post].shape != captured[final].shape:
                raise ValueError(
                    f"{post} is {tuple(captured[post].shape)} but the model's head reads its "
                    f"last block's output, {tuple(captured[final].shape)}: LeGrad applies to "
                    "the layers over the last block's tokens only (the last stage of a "
                    "hierarchical model; none in CaiT, whose head reads a class-attention "
                    "stage)."
                )
            pattern = captured[name]
            on_path = hm.tap(name).read.on_path_of(pattern)
            score = score_of(readout(captured[post]))
            last = index == len(names) - 1
            (grad,) = torch.autograd.grad(score.sum(), on_path, retain_graph=not last,
                                          allow_unused=True)  # fmt: skip
            if grad is None:
                raise ValueError(
                    f"The score does not depend on {name}: vizkit computes that map beside the "
                    "model's attention, so it has no gradient; use attnlrp or a CAM."
                )
            relevance.append(_key_relevance(hm, name, grad.reshape(pattern.shape), layout))
    keys = torch.stack(relevance).mean(0)  # (B, N)
    _, patches = layout.split(keys, dim=-1)
    return SaliencyResult(
        maps=layout.to_grid(patches).float(),
        method="legrad",
        image_size=image_size,
        options={"layers": names},
        layout=layout,
        targets=explained_classes(logits, target),
    )


def _key_relevance(hm: HookedModel, name: str, grad: Tensor, layout) -> Tensor:
    """(B, N) relevance of each key token: the positive gradient at the map, averaged over
    heads and queries (a window map's over its window's queries, on the stage grid; a divided
    space-time map's over the queries of its step, put on the clip's tokens as the map is)."""
    positive = grad.detach().clamp_min(0)
    if hm.tap(name).kind not in ("window", "temporal", "spatial"):
        return positive.mean((1, 2))
    on_grid = grid_map(hm, name, positive, layout)  # (B, H, Np, Np), zero across windows
    return on_grid.sum(2).mean(1) / positive.shape[-2]


def _readout(
    hm: HookedModel, images: Tensor, final: str, last: Tensor, logits: object
) -> Callable[[Tensor], Tensor]:
    """``tokens -> logits``: the model's head on a block's output tokens: the family's
    readout where it gives the model's output on the last block (not so under a wrapper with
    a head of its own), else the model's forward replayed with its last block's output
    replaced."""
    if hm.family.readout is not None and _reads_the_output(hm, last, logits):
        return hm.family.readout

    def replayed(tokens: Tensor) -> Tensor:
        with hm.hooks(fwd={final: lambda value, *, name: tokens}):
            return model_logits(hm(images))

    return replayed


def _scorer(logits: object, target: Target) -> Callable[[Tensor], Tensor]:
    """``layer_logits (B, K) -> (B,)``: each image's target score (the callable target's value,
    or its class logit: an int, B ints, or None for the argmax of the model's ``logits``)."""
    if is_score_target(target):
        return lambda layer_logits: call_target(
            target, layer_logits, None, output_rows(layer_logits)
        )
    index = target_indices(model_logits(logits), target)[:, None]
    return lambda layer_logits: layer_logits.gather(1, index.to(layer_logits.device))[:, 0]


def _reads_the_output(hm: HookedModel, last: Tensor, logits: object) -> bool:
    """Whether the family's head on the last block's output gives the model's output (with a
    head of the user's own, a wrapper's, each layer's score would be another class's)."""
    with torch.no_grad():
        read = hm.family.readout(last).float()
    output = model_logits(logits)
    same = isinstance(output, Tensor) and output.shape == read.shape
    return same and torch.allclose(read, output.float(), rtol=1e-4, atol=1e-5)


def _block_output(pattern: str, known: set[str]) -> str:
    """The ``hook_resid_post`` of the block holding the map ``pattern``."""
    parts = pattern.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut]) + ".hook_resid_post"
        if name in known:
            return name
    raise ValueError(f"{pattern} is in no block whose output vizkit reads.")
