"""What a test-time register changes on a batch (Jiang et al. 2025, "Vision Transformers Don't
Need Trained Registers", Sec. 4-5): the class token's attention over the patches, the patch
norms at the detection block, the model's output, and how faithful the attention map is
(deletion and insertion, Petsiuk et al. 2018), without and with the register.

The attention map is the class token's row of the run's last block, averaged over heads, over
the patch columns (the register's column left out and the row not renormalized, as the
reference reads it); a stream without a class token reads the attention each patch receives,
averaged over the patch queries."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.result import Result
from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_images, refuse_video_model
from ..hooks.scores import is_backbone, model_logits
from ..hooks.selector import select_layer
from ..metrics.faithfulness import CurveEnds, CurveScoring, perturbation_curve
from ..targets import embedding_of, similar_to
from .register_token import test_time_register
from .sites import RegisterSites, register_sites

__all__ = ["RegisterEffect", "register_effect"]


@dataclass(repr=False)
class RegisterEffect(Result):
    """One batch without and with a test-time register.

    Attributes:
        attention: (2, B, gh, gw) the attention map without [0] and with [1] the register.
        register_attention: (B, R) what the registers receive in the same row.
        norms: (2, B, gh, gw) the patch norms at the detection block's output.
        register_norms: (B, R) the registers' norms there.
        output_cosine: (B,) cosine between the model's outputs without and with.
        agreement: (B,) whether the predicted class stays (None for a backbone).
        deletion, insertion: (2, B) areas under the curves of the two maps, each on its
            model (deletion: lower is more faithful; insertion: higher); None when not asked.
        neurons: block path -> the neurons moved.
        attention_block, detect: the blocks the maps and the norms are read at.
    """

    attention: Tensor
    register_attention: Tensor
    norms: Tensor
    register_norms: Tensor
    output_cosine: Tensor
    agreement: Tensor | None
    deletion: Tensor | None
    insertion: Tensor | None
    neurons: dict[str, list[int]]
    attention_block: str
    detect: str
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def peak_ratio(self) -> Tensor:
        """(2, B) each map's largest patch over its median patch: artifacts make it large."""
        flat = self.attention.flatten(2)
        return flat.amax(-1) / flat.quantile(0.5, dim=-1).clamp(min=1e-12)


def register_effect(
    model: nn.Module | HookedModel, x: Tensor, neurons: object, layer=-1, attention_layer=-1,
    registers: int = 1, scale: float = 1.0, patches: str = "zero", faithfulness: bool = True,
    target=None, steps: int | None = None, progress: bool = False,
) -> RegisterEffect:  # fmt: skip
    """The batch ``x`` (B, C, H, W) without and with a test-time register of ``neurons``.

    Args:
        neurons: `RegisterNeurons` or {block: [neuron indices]} (as `test_time_register`).
        layer: the block whose output norms are compared (``layer=``; the detection block).
        attention_layer: the block whose class-token attention is compared.
        registers, scale, patches: as `test_time_register`.
        faithfulness: also run deletion and insertion of each map on its model.
        target: what the curves score (`vk.metrics.deletion`); None: the predicted class, or on
            a backbone the cosine to the image's own embedding (`vk.targets.similar_to`).
        steps: the curves' steps (None: min(16, patches)).

    Raises:
        ValueError / TypeError: as `test_time_register` (a model whose attention depends on
            each token's position, bad neurons or options).
    """
    refuse_video_model(model.model if isinstance(model, HookedModel) else model, "register_effect")
    return _effect(model, x, neurons, layer, attention_layer, registers, scale, patches,
                   faithfulness, steps, progress, scored=target)  # fmt: skip


@analysis_contract
def _effect(
    hm: HookedModel, x, neurons, layer, attention_layer, registers, scale, patches, faithfulness,
    steps, progress, scored,
) -> RegisterEffect:  # fmt: skip
    """``scored``: the curves' target (the deletion curves check it; None is resolved here)."""
    x = check_images(hm.model, x)
    image_size = tuple(x.shape[-2:])
    sites = register_sites(hm, image_size)
    detect = select_layer(layer, sites.blocks, what="blocks")
    block = select_layer(attention_layer, sites.blocks, arg="attention_layer", what="blocks")
    pattern = _map_name(hm, block)
    names = [pattern, f"{detect}.hook_resid_post"]
    layout = hm.token_layout(image_size, f"{sites.blocks[0]}.hook_resid_pre")
    with torch.no_grad():
        before, cache = hm.run_with_cache(x, names=names)
        plain = _read(cache, names, sites, layout, None)
        options = {"registers": registers, "scale": scale, "patches": patches}
        with test_time_register(hm, neurons, image_size=image_size, **options) as state:
            after, cache = hm.run_with_cache(x, names=names)
        registered = _read(cache, names, sites, layout, state.stream)
    outputs = [embedding_of(model_logits(o)).float() for o in (before, after)]
    agreement = None if is_backbone(hm.model) else outputs[0].argmax(-1) == outputs[1].argmax(-1)
    curves = {"deletion": None, "insertion": None}
    if faithfulness:
        targets = [scored] * 2
        if scored is None and is_backbone(hm.model):
            targets = [similar_to(o) for o in outputs]
        maps = [plain[0], registered[0]]
        curves = _curves(hm, x, maps, targets, (before, after), state.neurons, options, steps,
                         progress)  # fmt: skip
    return RegisterEffect(
        torch.stack([plain[0], registered[0]]), registered[1],
        torch.stack([plain[2], registered[2]]), registered[3],
        F.cosine_similarity(*outputs, dim=-1), agreement, curves["deletion"],
        curves["insertion"], state.neurons, block, detect,
        options={**options, "layer": detect, "attention_layer": block, "steps": steps},
        layout=layout, image_size=image_size,
    )  # fmt: skip


def _map_name(hm: HookedModel, block: str) -> str:
    """The map that weighs ``block``'s values (after talking heads' mixing, CaiT's)."""
    names = [n for n in hm.hook_names() if n.startswith(f"{block}.")
             and n.endswith(".hook_pattern") and hm.tap(n).kind in (None, "", "self")]  # fmt: skip
    if len(names) != 1:
        raise ValueError(
            f"{block} has {len(names)} softmax maps over every token, not one to compare; pick "
            "another block with attention_layer=."
        )
    return names[0]


def _read(cache, names: list[str], sites: RegisterSites, layout: TokenLayout, stream):
    """(map (B, gh, gw), register attention (B, R), patch norms (B, gh, gw), register norms
    (B, R)) of one run; ``stream``: the registers at the run's last block (None: no register)."""
    pattern, resid = (cache[n].float() for n in names)  # (B, H, T, T), (B, T', C)
    prefix, tokens = sites.prefix_tokens, layout.num_tokens
    patches = slice(prefix, tokens)
    rows = pattern[:, :, 0] if layout.class_token else pattern[:, :, patches].mean(2)
    attention = rows.mean(1)  # (B, T)
    norms = resid.norm(dim=-1)
    if stream is not None and resid.shape[1] == tokens:  # the detection block is the last
        norms = torch.cat([norms, stream.float().norm(dim=-1)], 1)
    return (layout.to_grid(attention[:, patches]).cpu(), attention[:, tokens:].cpu(),
            layout.to_grid(norms[:, patches]).cpu(), norms[:, tokens:].cpu())  # fmt: skip


def _curves(hm, x, maps, targets, clean, neurons, options, steps, progress) -> dict[str, Tensor]:
    """Deletion and insertion AUCs (2, B) of the plain map on the plain model and of the
    registered map with the register; ``clean``: each model's output on ``x``, the curves'
    start (not run again), their baselines run once for both curves."""
    found = {"deletion": [], "insertion": []}
    plain = contextlib.nullcontext()
    registered = test_time_register(hm, neurons, image_size=tuple(x.shape[-2:]), **options)
    rows = torch.arange(len(x), device=x.device)
    for context, saliency, target, output in zip((plain, registered), maps, targets, clean,
                                                 strict=True):  # fmt: skip
        scoring = CurveScoring.of(target)
        ends = CurveEnds(scoring.read(output, rows), {}, scoring)
        with context:
            for kind, baseline in (("deletion", "zero"), ("insertion", "blur")):
                result = perturbation_curve(kind, hm, x, saliency, target, "patch", baseline,
                                            steps, None, progress, ends)  # fmt: skip
                found[kind].append(result.auc)
    return {kind: torch.stack(aucs) for kind, aucs in found.items()}
