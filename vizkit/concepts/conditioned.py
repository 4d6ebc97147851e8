"""Concept-conditional maps: the relevance of a prediction that flows through one unit of a
layer (a channel of a token stream, or a sparse autoencoder's latent), as concept relevance
propagation conditions it (Achtibat et al. 2023, "From attribution maps to human-understandable
explanations through Concept Relevance Propagation", Nature Machine Intelligence, Sec. 2.1,
Eq. 5: the relevance at layer l masked to the concept's channels, then propagated on).

The backward pass from the target to the images is linear in the gradient it carries through
the layer; conditioning masks that gradient. One forward and backward give the gradient g at
the layer; a unit's map passes back from the layer to the images only its part of g: channel
c's g_c, or for latent j of an autoencoder on a, a = sum_j z_j(a) d_j + b + e(a)
(d_j = W_dec[j] / input_scale, e the error), the gradient through z_j(a) d_j. What reaches the
output around the layer (the skip connection around a branch such as an MLP's hidden layer) is
in no unit's map; the rest (one more backward from the target, the layer passing back only
the other units' gradient: the error and the tokens the autoencoder does not read too) holds
it. Where the method is linear in the gradient (input x gradient, AttnLRP and CP-LRP, whose
rules change the backward but keep it linear), the maps of the units plus the rest add up to
the unconditioned map.

A unit's relevance at the layer is the sum over tokens of a_c g_c (channels) or of
z_j (d_j . g) (latents), g the gradient (for AttnLRP: the modified one) at the layer.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..analysis.result import Result
from ..hooks import HookedModel, Target, TokenLayout
from ..hooks.contract import analysis_contract, as_hooked, eval_mode
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import check_count, check_images
from ..hooks.scores import explained_classes, target_score
from ..methods.relevance_rules import ATTENTION_RULES, relevance_rules
from ..sae.autoencoder import SparseAutoencoder
from ..sae.spliced import replaced_tokens

__all__ = ["CONDITIONED_METHODS", "ConditionedMaps", "conditioned_maps"]

CONDITIONED_METHODS = ("attnlrp", "cp", "input_x_gradient")


@dataclass(repr=False)
class ConditionedMaps(Result):
    """Each chosen unit's share of the images' relevance for the target.

    Attributes:
        units: the L units' names; ``layer``: where they are.
        maps: (B, L, H, W) the relevance through each unit, summed over the image channels.
        rest: (B, H, W) the relevance through everything else at the layer.
        total: (B, H, W) the unconditioned map (``maps.sum(1) + rest`` where the method is
            linear in the layer's gradient, which all of `CONDITIONED_METHODS` are).
        relevance: (B, U) every unit's relevance at the layer (all U units, not only L).
        classes: (B,) the class explained, or None for a callable target.
    """

    units: list[str]
    layer: str
    maps: Tensor
    rest: Tensor
    total: Tensor
    relevance: Tensor
    classes: Tensor | None = None
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None


@analysis_contract
def conditioned_maps(
    model: nn.Module | HookedModel,
    x: Tensor,
    target: Target,
    units: str | SparseAutoencoder,
    chosen: list[int] | None = None,
    method: str = "attnlrp",
    top: int = 8,
) -> ConditionedMaps:
    """The relevance of ``target`` on images ``x`` (B, C, H, W) through each ``chosen`` unit:
    one forward and backward of the batch, one backward from the layer per unit, and one
    forward and backward for the rest.

    Args:
        target: a class, B classes, None (each image's top class) or a callable on the output.
        units: a hook name of a token stream (B, N, C), each channel a unit; or a
            `vizkit.sae.SparseAutoencoder` trained on this model, each latent a unit.
        chosen: the units to condition on (indices); None: the ``top`` of highest relevance
            summed over the images.
        method: "attnlrp", "cp" (AttnLRP's rules, CP-LRP) or "input_x_gradient".

    Returns:
        `ConditionedMaps`.
    """
    if method not in CONDITIONED_METHODS:
        raise ValueError(f"method must be one of {CONDITIONED_METHODS}; got {method!r}.")
    hm = as_hooked(model)
    x = check_images(hm.model, x).detach()
    layer, split = _layer_split(hm, units, tuple(x.shape[-2:]))
    relevance, total, output, chosen, maps = _through_layer(
        hm, x, target, layer, split, method, chosen, check_count("top", top)
    )
    names = [f"{'latent' if split else layer} {i}" for i in range(relevance.shape[1])]
    rest = _rest(hm, x, target, layer, split, chosen, method)
    return ConditionedMaps(
        [names[i] for i in chosen], layer, maps, rest, total, relevance,
        explained_classes(output, target),
        options={"method": method, "units": "sae" if split else "channels",
                 "chosen": list(chosen)},
        layout=hm.token_layout(tuple(x.shape[-2:]), layer), image_size=tuple(x.shape[-2:]),
    )  # fmt: skip


Split = Callable[[Tensor], Tensor]  # activation (B, N, C) -> each unit's part (B, N, U, C)


def _layer_split(
    hm: HookedModel, units: object, image_size: tuple[int, int]
) -> tuple[str, Split | None]:
    """The layer and how its activation splits into the units' parts (None: channels)."""
    if isinstance(units, SparseAutoencoder):
        positions = replaced_tokens(hm, units, image_size)
        return units.source["layer"], _latent_parts(units, positions)
    if not isinstance(units, str):
        raise TypeError(
            f"units must be a hook name or a SparseAutoencoder; got {type(units).__name__}."
        )
    return hm.tap(units).name, None


def _latent_parts(sae: SparseAutoencoder, positions: Tensor) -> Split:
    """activation (B, N, C) -> (B, N, latents, C): z_j(a) d_j at the tokens ``positions`` the
    autoencoder reads, 0 at the others."""
    directions = sae.W_dec / sae.input_scale  # (latents, C)

    def parts(value: Tensor) -> Tensor:
        with eval_mode(sae):
            latents = sae.encode(value[:, positions].to(sae.W_dec.device))  # (B, T, latents)
        out = value.new_zeros(*value.shape[:2], sae.latents, value.shape[-1])
        out[:, positions] = (latents[..., None] * directions).to(value)
        return out

    return parts


def _through_layer(
    hm: HookedModel, x: Tensor, target: Target, layer: str, split: Split | None, method: str,
    chosen: list[int] | None, top: int,
) -> tuple[Tensor, Tensor, object, list[int], Tensor]:  # fmt: skip
    """One forward and backward: (B, U) each unit's relevance at the layer, (B, H, W) the
    unconditioned map, the output, the units chosen, and (B, L, H, W) the relevance through
    each chosen unit alone: the layer's gradient g masked to the unit and passed back from the
    layer to the images (so what reaches the output around the layer, as a branch's skip
    connection does, is in no unit's map)."""
    seen: dict[str, Tensor] = {}

    def keep(value: Tensor, *, name: str) -> Tensor:
        # a copy the forward goes on from: where the layer's canonical layout is a view of the
        # module's (a Swin stage's NHWC map as tokens), the value handed over is no input of
        # the rest of the forward, and the target's gradient would never reach it
        seen["value"] = value.clone()
        return seen["value"]

    x = x.detach().requires_grad_(True)
    rules = relevance_rules(method, hm.model) if method in ATTENTION_RULES else nullcontext()
    with frozen_parameters(hm.model), torch.enable_grad(), hm.hooks(fwd={layer: keep}):
        with rules:
            output = hm(x)
        at_x, gradient = torch.autograd.grad(
            target_score(output, target, len(x)), [x, seen["value"]], allow_unused=True,
            retain_graph=True)  # fmt: skip
        value = seen["value"]
        if gradient is None:
            raise ValueError(
                f"The target's gradient does not reach {layer}: the output explained does not "
                "depend on it. Choose a layer before the output."
            )
        if value.ndim != 3:
            raise ValueError(
                f"{layer} is {tuple(value.shape)}, not a token stream (B, N, C): condition on "
                "a block output (<block>.hook_resid_post), a branch output or an MLP hidden "
                "layer."
            )
        with torch.no_grad():
            if split is None:
                relevance = (value * gradient).sum(1)  # (B, C)
            else:
                relevance = (split(value) * gradient[:, :, None]).sum((1, 3))  # (B, latents)
        chosen = _chosen(chosen, relevance, top)
        maps = torch.stack([_from_layer(x, value, gradient, split, unit, method)
                            for unit in chosen], 1)  # fmt: skip
    total = torch.zeros_like(x) if at_x is None else x * at_x
    return relevance.float().cpu(), total.detach().sum(1).cpu(), output, chosen, maps.cpu()


def _from_layer(
    x: Tensor, value: Tensor, gradient: Tensor, split: Split | None, unit: int, method: str
) -> Tensor:  # fmt: skip
    """(B, H, W) the relevance through ``unit`` alone: its part of the layer's ``value``
    (B, N, C) times the layer's ``gradient``, passed back to the images x (an autoencoder's
    part under ``method``'s rules, as in the forward's hook)."""
    if split is None:
        through = value[..., unit] * gradient[..., unit].detach()
    else:
        with relevance_rules(method) if method in ATTENTION_RULES else nullcontext():
            through = split(value)[:, :, unit] * gradient.detach()
    (at_x,) = torch.autograd.grad(through.sum(), x, retain_graph=True, allow_unused=True)
    return (torch.zeros_like(x) if at_x is None else x * at_x).detach().sum(1)


def _chosen(chosen: list[int] | None, relevance: Tensor, top: int) -> list[int]:
    """The unit indices to condition on, checked (None: the ``top`` of most relevance)."""
    count = relevance.shape[1]
    if chosen is None:
        return relevance.sum(0).topk(min(top, count)).indices.tolist()
    chosen = [int(i) for i in chosen]
    if not chosen or len(set(chosen)) != len(chosen) or not all(0 <= i < count for i in chosen):
        raise ValueError(f"chosen must be distinct unit indices in [0, {count}); got {chosen}.")
    return chosen


def _rest(
    hm: HookedModel, x: Tensor, target: Target, layer: str, split: Split | None,
    chosen: list[int], method: str,
) -> Tensor:  # fmt: skip
    """(B, H, W) the relevance through everything but the ``chosen`` units: the layer passes
    back only the gradient through the other units (and, of an autoencoder, its error and the
    tokens it does not read), and whatever reaches the output around the layer."""

    def condition(value: Tensor, *, name: str) -> Tensor:
        held = value.detach()
        if split is None:
            keep = torch.ones(value.shape[-1], device=value.device, dtype=value.dtype)
            keep[chosen] = 0
            return held + (value - held) * keep
        through = value - split(value)[:, :, chosen].sum(2)
        return held + through - through.detach()

    return _backward(hm, x, target, layer, condition, method).cpu()


def _backward(
    hm: HookedModel, x: Tensor, target: Target, layer: str, hook: Callable, method: str
) -> Tensor:
    """(B, H, W) the images' relevance (x times the gradient, under ``method``'s rules) summed
    over channels with ``hook`` on the layer."""
    x = x.detach().requires_grad_(True)
    rules = relevance_rules(method, hm.model) if method in ATTENTION_RULES else nullcontext()
    with frozen_parameters(hm.model), torch.enable_grad(), hm.hooks(fwd={layer: hook}):
        with rules:
            output = hm(x)
        (grad,) = torch.autograd.grad(target_score(output, target, len(x)), [x])
    return (x * grad).detach().sum(1)
