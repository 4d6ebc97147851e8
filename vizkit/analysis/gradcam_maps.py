"""Grad-CAM (Selvaraju et al. 2017) for ViTs (on tokens) and CNNs (on feature maps).

Both read an activation A and the gradient G of the target logit with respect to it, weight each
channel by its mean gradient over positions, and keep the positive part: relu(sum_c w_c A_c).
"""

from __future__ import annotations

import warnings

from torch import Tensor, nn

from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.inputs import check_images
from ..hooks.layout import feature_map_format, require_per_image
from ..hooks.selection import LayerSpec, layer_indices, select_layer
from ..hooks.targets import explained_classes
from ._model import reads_class_token
from .saliency_result import SaliencyResult

__all__ = ["default_gradcam_layer", "gradcam", "gradcam_layers"]


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


@analysis_contract
def gradcam(
    model: nn.Module | HookedModel,
    x: Tensor,
    target: Target = None,
    layer: LayerSpec | None = None,
) -> SaliencyResult:
    """Grad-CAM maps of a batch.

    Args:
        model: a timm ViT-family model or CNN, or a HookedModel.
        x: image batch (B, C, H, W).
        target: int, B ints, a callable on the logits, or None for each sample's argmax.
        layer: the activation: an int counting `gradcam_layers` (one per block or stage,
            negative from the end; default the last), a module path (``"blocks.3"``: that
            block's entry of `gradcam_layers`) or any hook name.

    Returns:
        `SaliencyResult` with maps (B, gh, gw) for token activations (patch grid) or (B, h, w)
        for feature maps; options ``layer`` (hook name) and ``layer_index`` (its position in
        `gradcam_layers`, None for another activation).
    """
    hm = as_hooked(model)
    x = check_images(hm.model, x)
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
    logits, cache = hm.run_with_cache(x, names=layer, grads=True, target=target)
    act, grad = cache[layer], cache[f"{layer}_grad"]
    require_per_image(layer, act, len(x))
    layout = None
    if act.ndim == 3:  # tokens (B, N, C)
        layout = hm.token_layout(tuple(x.shape[-2:]), layer)
        if layout is None:
            raise ValueError(f"{layer} is a token activation but the model has no patch grid.")
        act, grad = (layout.split(t, dim=1)[1] for t in (act, grad))  # (B, Np, C)
        cam = (grad.mean(1, keepdim=True) * act).sum(-1).clamp_min(0)
        maps = layout.to_grid(cam)
    elif act.ndim == 4:  # feature maps (B, C, h, w) or channels-last (B, h, w, C)
        if feature_map_format(hm.tap(layer).shape, act, tuple(x.shape[-2:])) == "NHWC":
            act, grad = act.permute(0, 3, 1, 2), grad.permute(0, 3, 1, 2)
        maps = (grad.mean((2, 3), keepdim=True) * act).sum(1).clamp_min(0)
    else:
        raise ValueError(
            f"Grad-CAM needs a token activation (B, N, C) or a feature map (B, C, h, w); "
            f"{layer} is {tuple(act.shape)}."
        )
    dead = (grad.flatten(1) == 0).all(1)
    if dead.any():
        warnings.warn(
            f"All gradients at {layer} are zero for samples {dead.nonzero()[:, 0].tolist()}: "
            "the target does not depend on this activation (after the last block only the "
            "class token reaches a token-pooling head). Choose an earlier layer.",
            stacklevel=3,  # the caller of the `analysis` wrapper
        )
    return SaliencyResult(
        maps=maps.float(),
        method="gradcam",
        image_size=tuple(x.shape[-2:]),
        options={"layer": layer, "layer_index": layer_indices([layer], counted)[0]},
        layout=layout,
        targets=explained_classes(logits, target),
    )
