"""LeGrad (Bousselham et al. 2024, "LeGrad: An Explainability Method for Vision Transformers via
Feature Formation Sensitivity", Sec. 3): for each self-attention layer l, the model's head read
on that block's output gives a score s^l (what the layer would predict); the positive part of
its gradient with respect to the layer's own post-softmax map A^l, averaged over heads and
queries, is the layer's relevance of each key token; the map is the mean over layers of the
patch keys' relevance. Attention values are not multiplied in."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..analysis._model import attention_names
from ..analysis.attention_maps import common_layout
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.hooked_model import frozen_parameters
from ..hooks.inputs import check_images
from ..hooks.selection import LayerSpec
from ..hooks.targets import explained_classes, model_logits, target_indices
from .registry import saliency_method

__all__ = ["legrad"]


@saliency_method(
    "legrad", needs=("attention", "gradients"),
    summary="each layer's own score differentiated at its attention map (Bousselham et al. 2024)",
)  # fmt: skip
@analysis_contract
def legrad(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    layers: LayerSpec | None = None,
) -> SaliencyResult:  # fmt: skip
    """LeGrad maps (B, gh, gw) over the self-attention ``layers`` (default: all of them; they
    must share one token layout, e.g. one stage of a hierarchical model).

    Raises:
        ValueError: a model whose family gives no head readout (`FamilyLayout.readout`), or
            layers of different token layouts.
    """
    hm = as_hooked(model)
    x = check_images(hm.model, x)
    if hm.family is None or hm.family.readout is None:
        raise ValueError(
            f"LeGrad reads the model's head on every layer's tokens, and vizkit knows no such "
            f"readout for {type(hm.model).__name__} (its family gives none); use grad_rollout "
            "or a CAM."
        )
    names = attention_names(hm, layers)
    layout = common_layout(hm, names, tuple(x.shape[-2:]), fix="Pass layers= of one stage.")
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
        _check_readout(hm, captured[final], logits)
        score_of = _scorer(logits, target)  # the class indices resolved once, for every layer
        relevance = []
        for index, (name, post) in enumerate(zip(names, posts, strict=True)):
            pattern = captured[name]
            on_path = (
                pattern._base if hm.tap(name).read_only and pattern._base is not None else pattern
            )
            layer_logits = hm.family.readout(captured[post])
            score = score_of(layer_logits)
            (grad,) = torch.autograd.grad(score.sum(), on_path, retain_graph=index < len(names) - 1)
            relevance.append(grad.view(pattern.shape).detach().clamp_min(0).mean((1, 2)))
    keys = torch.stack(relevance).mean(0)  # (B, N)
    _, patches = layout.split(keys, dim=-1)
    return SaliencyResult(
        maps=layout.to_grid(patches).float(),
        method="legrad",
        image_size=tuple(x.shape[-2:]),
        options={"layers": names},
        layout=layout,
        targets=explained_classes(logits, target),
    )


def _scorer(logits: object, target: Target) -> Callable[[Tensor], Tensor]:
    """``layer_logits (B, K) -> (B,)``: each image's target score (the callable target's value,
    or its class logit: an int, B ints, or None for the argmax of the model's ``logits``)."""
    if callable(target) and not isinstance(target, Tensor):

        def called(layer_logits: Tensor) -> Tensor:
            score = target(layer_logits)
            if not isinstance(score, Tensor) or score.shape != layer_logits.shape[:1]:
                raise ValueError(
                    "LeGrad needs a callable target that gives one score per image, shape "
                    f"(B,); got {getattr(score, 'shape', type(score).__name__)}."
                )
            return score

        return called
    index = target_indices(model_logits(logits), target)[:, None]
    return lambda layer_logits: layer_logits.gather(1, index.to(layer_logits.device))[:, 0]


def _check_readout(hm: HookedModel, last: Tensor, logits: object) -> None:
    """Refuse unless the family's head on the last block's output gives the model's output:
    with a head of the user's own (a wrapper), each layer's score would be another class's."""
    with torch.no_grad():
        read = hm.family.readout(last).float()
    output = model_logits(logits)
    same = isinstance(output, Tensor) and output.shape == read.shape
    if not same or not torch.allclose(read, output.float(), rtol=1e-4, atol=1e-5):
        raise ValueError(
            f"The model's output is not its family's head read on its last block "
            f"({type(hm.model).__name__} adds a head of its own?), so LeGrad's per-layer scores "
            "would explain another output; run it on the model whose head is the family's, or "
            "use grad_rollout or a CAM."
        )


def _block_output(pattern: str, known: set[str]) -> str:
    """The ``hook_resid_post`` of the block holding the map ``pattern``."""
    parts = pattern.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut]) + ".hook_resid_post"
        if name in known:
            return name
    raise ValueError(f"{pattern} is in no block whose output vizkit reads.")
