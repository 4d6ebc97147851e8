"""The template every class-activation map shares, for ViTs (on tokens) and CNNs (on feature
maps): the methods in `vizkit.methods` (Grad-CAM, Grad-CAM++, XGrad-CAM, HiResCAM, LayerCAM,
Eigen-CAM, Score-CAM, Ablation-CAM) are each a channel weighting over it.

A CAM reads one activation A as channels over a grid, (B, C, h, w), with the gradient G of the
target score with respect to it where it needs one (`cam_activation`: the token reshape is done
here once, from the family's token layout), weights its channels, and keeps the positive part of
the weighted sum: relu(sum_c w_c A_c) (`channel_cam`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..hooks import HookedModel, Target, TokenLayout
from ..hooks.contract import as_hooked
from ..hooks.inputs import check_images
from ..hooks.layout import feature_map_format, require_per_image
from ..hooks.scores import explained_classes
from ..hooks.selector import LayerSpec, layer_indices, select_layer
from ._model import reads_class_token
from .saliency_result import SaliencyResult

__all__ = [
    "CamActivation",
    "cam_activation",
    "cam_maps",
    "cam_result",
    "channel_cam",
    "default_gradcam_layer",
    "gradcam_layers",
]


def default_gradcam_layer(hm: HookedModel) -> str:
    """The activation Grad-CAM reads by default: the last of `gradcam_layers`."""
    counted = gradcam_layers(hm)
    if not counted:
        raise ValueError(
            f"No default Grad-CAM layer for {type(hm.model).__name__}; pass layer=<hook name> "
            "(a (B, N, C) token activation or a (B, C, h, w) feature map; see hook_names())."
        )
    return counted[-1]


def gradcam_layers(hm: HookedModel) -> list[str]:
    """The activations ``gradcam(layer=int)`` counts, one per block or stage, in forward order.

    - Transformers whose head reads the class token (ViT, DeiT, PiT, XCiT, CrossViT): each
      block's input ``<block>.hook_resid_pre`` (after the last block only the class token reaches
      the head, so the patch tokens' gradients there are zero).
    - SoT heads (`vizkit.papers.sot.SoTHead`): the same layer, where the ClassT branch still sees
      the patch tokens.
    - Transformers that pool every token (average, attention pooling: EVA02, SigLIP, Swin,
      Twins, MaxViT), and CaiT (whose class-attention stage reads the last self-attention
      block's output): each block's output ``<block>.hook_resid_post``, on its stage grid.
    - CNNs: the output of each feature stage (timm ``feature_info``), ``<stage>.hook_out``.
    - Otherwise none.
    """
    model = hm.model
    blocks = [
        n.removesuffix(".hook_resid_pre")
        for n in hm.hook_names()
        if n.endswith(".hook_resid_pre") and hm.tap(n).shape != "B 1 C"  # not a class stream
    ]
    if blocks:
        token_pooled = reads_class_token(hm) and not hasattr(model, "blocks_token_only")
        return [f"{block}.hook_resid_{'pre' if token_pooled else 'post'}" for block in blocks]
    known = set(hm.hook_names())
    stages = [f"{f['module']}.hook_out" for f in getattr(model, "feature_info", None) or ()]
    return [name for name in stages if name in known]


@dataclass
class CamActivation:
    """One activation of a batch as channels over its grid, for a class-activation map.

    Attributes:
        act: (B, C, h, w) the activation (a token activation's patch tokens on the patch grid).
        grad: (B, C, h, w) the gradient of the target score with respect to it, or None.
        layer: its hook name; layer_index: its position in `gradcam_layers` (or None).
        layout: the token layout for token activations, None for feature maps.
        logits: the model's output on the batch.
        channels_last: the activation is (B, h, w, C) where the model holds it (a method that
            edits it, as Ablation-CAM does, edits its last axis).
    """

    act: Tensor
    grad: Tensor | None
    layer: str
    layer_index: int | None
    layout: TokenLayout | None
    logits: Tensor
    channels_last: bool = False


def cam_activation(
    hm: HookedModel,
    x: Tensor,
    target: Target,
    layer: LayerSpec | None,
    gradients: bool = True,
    method: str = "Grad-CAM",
) -> CamActivation:
    """The activation ``layer`` (default `default_gradcam_layer`) of images ``x`` as (B, C, h, w),
    with the gradient of the target score where ``gradients``.

    Raises:
        ValueError: an attention pattern, an activation of another rank, or windows (no
            per-image reading).
    """
    counted = gradcam_layers(hm)
    if layer is None:
        layer = default_gradcam_layer(hm)
    layer = select_layer(layer, counted, hm.hook_names(), what="Grad-CAM layers")
    if (hm.tap(layer).shape or "").startswith("B H"):
        raise ValueError(
            f"{layer} is an attention pattern (B, H, N, N), not a token activation (B, N, C) "
            "or a feature map (B, C, h, w); for attention use rollout() or grad_rollout(), "
            "or pass a residual name such as blocks.-1.hook_resid_pre."
        )
    if gradients:
        logits, cache = hm.run_with_cache(x, names=layer, grads=True, target=target)
        act, grad = cache[layer], cache[f"{layer}_grad"]
    else:  # no graph: the logits would hold every layer's activations for a backward
        with torch.no_grad():
            logits, cache = hm.run_with_cache(x, names=layer)
        act, grad = cache[layer], None
    require_per_image(layer, act, len(x))
    layout, channels_last = None, False
    if act.ndim == 3:  # tokens (B, N, C) -> patches on the grid (B, C, gh, gw)
        layout = hm.token_layout(tuple(x.shape[-2:]), layer)
        if layout is None:
            raise ValueError(f"{layer} is a token activation but the model has no patch grid.")
        act, grad = (None if t is None else _on_grid(t, layout) for t in (act, grad))
    elif act.ndim == 4:  # feature maps (B, C, h, w) or channels-last (B, h, w, C)
        if feature_map_format(hm.tap(layer).shape, act, tuple(x.shape[-2:])) == "NHWC":
            act, grad = (None if t is None else t.permute(0, 3, 1, 2) for t in (act, grad))
            channels_last = True
    else:
        raise ValueError(
            f"{method} needs a token activation (B, N, C) or a feature map (B, C, h, w); "
            f"{layer} is {tuple(act.shape)}."
        )
    if grad is not None:
        dead = (grad.flatten(1) == 0).all(1)
        if dead.any():
            warnings.warn(
                f"All gradients at {layer} are zero for samples {dead.nonzero()[:, 0].tolist()}: "
                "the target does not depend on this activation (after the last block only the "
                "class token reaches a token-pooling head). Choose an earlier layer.",
                stacklevel=4,  # the caller of the method's `analysis` wrapper
            )
    index = layer_indices([layer], counted)[0]
    return CamActivation(act, grad, layer, index, layout, logits, channels_last)


def _on_grid(tokens: Tensor, layout: TokenLayout) -> Tensor:
    """(B, N, C) tokens -> (B, C, gh, gw): the patch tokens on the patch grid. A video's token
    frames are stacked along the rows, (B, C, T' gh, gw): the channel-weighted CAMs treat the
    positions as a set (means, sums and products over them), so they are exact on it, and
    `cam_result` gives the frames their own axis back."""
    patches = layout.split(tokens, dim=1)[1]
    grid = layout.to_grid(patches.transpose(1, 2))
    return grid if layout.frames is None else grid.flatten(2, 3)


def channel_cam(found: CamActivation, weights: Tensor) -> Tensor:
    """relu(sum_c w_c A_c): (B, h, w) from channel weights (B, C)."""
    return (weights[:, :, None, None] * found.act).sum(1).clamp_min(0)


def cam_maps(
    model: nn.Module | HookedModel,
    x: Tensor,
    target: Target,
    layer: LayerSpec | None,
    method: str,
    maps_of: Callable[[CamActivation, HookedModel, Tensor], Tensor],
    gradients: bool = True,
    class_agnostic: bool = False,
    **options,
) -> SaliencyResult:
    """A CAM of images ``x``: ``maps_of(activation, hm, x)`` -> (B, h, w) maps of the
    activation ``layer`` (`cam_activation`, in float64: the weights of some CAMs divide by
    near-cancelling sums), as a `SaliencyResult` named ``method`` (``class_agnostic``: it
    explains no class)."""
    hm = as_hooked(model)
    x = check_images(hm.model, x)
    found = cam_activation(hm, x, target, layer, gradients, method)
    found.act = found.act.double()
    found.grad = None if found.grad is None else found.grad.double()
    explained = None if class_agnostic else target
    return cam_result(method, found, maps_of(found, hm, x), x, explained, class_agnostic, **options)


def cam_result(
    method: str, found: CamActivation, maps: Tensor, x: Tensor, target: Target,
    class_agnostic: bool = False, **options,
) -> SaliencyResult:  # fmt: skip
    """The `SaliencyResult` of a CAM: maps (B, h, w) on the activation's grid (a video's
    (B, T', gh, gw)), with the classes they explain (none when ``class_agnostic``)."""
    layout = found.layout
    if layout is not None and layout.frames is not None:  # rows back into frames (`_on_grid`)
        maps = maps.unflatten(1, (layout.frames, layout.grid[0]))
    return SaliencyResult(
        maps=maps.float(),
        method=method,
        image_size=tuple(x.shape[-2:]),
        options={"layer": found.layer, "layer_index": found.layer_index, **options},
        layout=found.layout,
        targets=None if class_agnostic else explained_classes(found.logits, target),
    )
