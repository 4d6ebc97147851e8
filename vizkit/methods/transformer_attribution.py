"""Transformer attribution (Chefer, Gur and Wolf, CVPR 2021, "Transformer Interpretability
Beyond Attention Visualization", Eq. 13-14): per block b, the relevance R^b of its attention map
A^b (LRP) weighted by the map's gradient, Abar^b = I + E_h[(grad A^b * R^b)^+], multiplied over
the blocks, C = Abar^1 ... Abar^B; the class token's row over the patches.

R^b is the relevance at the softmax output under `relevance_rules` (AttnLRP's rules, which
conserve the relevance through the attention products; the paper's own LRP uses alpha-beta
rules on the linear layers). grad A^b is the plain gradient of the target score.
`grad_rollout` is the same rollout with A^b in place of R^b (their ICCV 2021 method)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis._model import grid_map
from ..analysis.attention_rollout import class_row_relevance, gradient_rollout_maps, rolled_back
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import DEFAULT_MAX_BYTES, check_images
from ..hooks.scores import explained_classes, target_score
from .registry import saliency_method
from .relevance_rules import relevance_rules

__all__ = ["transformer_attribution"]


@saliency_method(
    "transformer_attribution", needs=("attention", "gradients"),
    summary="attention maps' LRP relevance times their gradient, rolled out (Chefer et al., "
    "CVPR 2021)",
)  # fmt: skip
@analysis_contract(videos=True)
def transformer_attribution(
    model: nn.Module | HookedModel,
    x: Tensor,
    target: Target = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> SaliencyResult:
    """Transformer-attribution maps (B, gh, gw) over the class token's row of C.

    Args:
        target: the class to explain: int, B ints, a callable on the logits, or None (argmax).
        max_bytes: refuse, before running, when every layer's map, its gradient and its
            relevance would take more than this (default 4 GiB).

    Raises:
        ValueError: models without a class token in self-attention (as `grad_rollout`), or
            whose maps are recomputed beside the forward (they have no gradient).
    """
    hm = as_hooked(model)
    names, layout = gradient_rollout_maps(hm, x, max_bytes, "transformer_attribution", held=3)
    x = check_images(hm.model, x)
    patterns, gradients, output = _maps_and_gradients(hm, x, target, names, rules=False)
    _, lrp_gradients, _ = _maps_and_gradients(hm, x, target, names, rules=True)
    relevance: Tensor | None = None
    for name in reversed(names):
        map_relevance = patterns[name] * lrp_gradients[name]  # R^b, (B, H, N, N)
        weighted = grid_map(hm, name, gradients[name] * map_relevance, layout)
        relevance = rolled_back(relevance, weighted)
    return SaliencyResult(
        maps=class_row_relevance(hm, relevance, layout),
        method="transformer_attribution",
        image_size=tuple(x.shape[-2:]),
        options={"maps": names},
        layout=layout,
        targets=explained_classes(output, target),
    )


def _maps_and_gradients(
    hm: HookedModel, x: Tensor, target: Target, names: list[str], rules: bool
) -> tuple[dict[str, Tensor], dict[str, Tensor], object]:
    """Each map of ``names`` (B, H, N, N) and the target score's gradient there, plain or
    under `relevance_rules` (the graph from the images, so every product sees its factors),
    and the model's output."""
    captured: dict[str, Tensor] = {}

    def keep(value: Tensor, *, name: str) -> None:
        captured[name] = value

    x = x.detach().requires_grad_(True)
    with frozen_parameters(hm.model), torch.enable_grad():
        with hm.hooks(fwd={name: keep for name in names}):
            if rules:
                with relevance_rules(model=hm.model):
                    output = hm(x)
            else:
                output = hm(x)
        on_path = [hm.tap(name).read.on_path_of(captured[name]) for name in names]
        grads = torch.autograd.grad(
            target_score(output, target, len(x)), on_path, allow_unused=True
        )
    missing = [name for name, grad in zip(names, grads, strict=True) if grad is None]
    if missing:
        raise ValueError(
            f"The target score does not depend on the maps {missing}: vizkit recomputes them "
            "beside the model's own attention, so they have no gradient. Use rollout or a CAM."
        )
    patterns = {name: captured[name].detach() for name in names}
    gradients = {
        name: grad.reshape(patterns[name].shape) for name, grad in zip(names, grads, strict=True)
    }
    return patterns, gradients, output
