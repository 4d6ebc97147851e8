"""Class-attention saliency: where the class token looks (CaiT Fig. 6 and 7; ViT's last CLS row)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..hooks import HookedModel
from ._model import as_hooked, attention_names, class_attention_names, on_model_device
from .saliency_result import SaliencyResult, min_max

__all__ = ["class_attention", "modulated_gray"]

_GRAY = (0.299, 0.587, 0.114)  # ITU-R BT.601 luma


def class_attention(
    model: nn.Module | HookedModel, x: Tensor, layer: int | None = None
) -> SaliencyResult:
    """The class token's attention over the patches.

    CaiT: the rows of class-attention layer ``layer`` (default 0, the layer the paper shows in
    Fig. 7). Plain ViTs: the class token's row in self-attention block ``layer`` (default the
    last).

    Returns:
        `SaliencyResult`: maps (B, gh, gw) = head mean of the patch weights; extras
        ``per_head`` (B, H, gh, gw) and ``cls_self`` (B, H), the class token's weight on itself
        (left out of the maps, not renormalized away).

    Raises:
        ValueError: a model without a class token, or a layer out of range.
    """
    hm = as_hooked(model)
    x = on_model_device(hm, x)
    class_stage = class_attention_names(hm)
    names = class_stage or attention_names(hm)
    default = 0 if class_stage else -1
    layer = default if layer is None else layer
    if (
        isinstance(layer, bool)
        or not isinstance(layer, int)
        or not -len(names) <= layer < len(names)
    ):
        stage = "class-attention" if class_stage else "attention"
        raise ValueError(
            f"layer {layer!r} is out of range: the model has {len(names)} {stage} layers "
            f"(valid: 0..{len(names) - 1} or negative from the end)."
        )
    name = names[layer]
    layout = hm.token_layout(tuple(x.shape[-2:]))
    if not layout.class_token:
        raise ValueError(
            f"{type(hm.model).__name__} has no class token, so there is no "
            "class attention. Use rollout() or gradcam() instead."
        )
    with torch.no_grad():
        logits, cache = hm.run_with_cache(x, names=name)
    row = cache[name][:, :, 0]  # (B, H, N)
    prefix, patches = layout.split(row, dim=-1)
    per_head = layout.to_grid(patches)
    return SaliencyResult(
        maps=per_head.mean(1),
        method="class_attention",
        image_size=tuple(x.shape[-2:]),
        options={"layer": layer % len(names), "name": name},
        layout=layout,
        targets=logits.argmax(-1) if logits.ndim == 2 else None,
        extras={"per_head": per_head, "cls_self": prefix[..., 0]},
    )


def modulated_gray(
    saliency: SaliencyResult, x: Tensor, mean: tuple[float, ...], std: tuple[float, ...]
) -> SaliencyResult:
    """CaiT Fig. 7: upsample the map (bilinear), min-max it per image and multiply the grey
    image with it (the paper shows the result with the cividis colormap).

    Args:
        saliency: e.g. `class_attention` of CA layer 0 (head mean).
        x: the normalized image batch (B, 3, H, W) it was computed on.
        mean, std: the normalization of ``x`` (``model.pretrained_cfg["mean"/"std"]``).

    Returns:
        `SaliencyResult` with pixel maps (B, H, W) in [0, 1] and ``extras["gray"]``.
    """
    if x.ndim != 4 or x.shape[1] != 3 or len(x) != len(saliency.maps):
        raise ValueError(
            f"x must be the (B={len(saliency.maps)}, 3, H, W) batch the saliency was computed "
            f"on; got {tuple(x.shape)}."
        )
    if tuple(x.shape[-2:]) != tuple(saliency.image_size):
        raise ValueError(
            f"Images are {tuple(x.shape[-2:])} but the saliency was computed for "
            f"{tuple(saliency.image_size)}."
        )
    mean_, std_ = (
        torch.tensor(v, dtype=x.dtype, device=x.device)[:, None, None] for v in (mean, std)
    )
    rgb = (x * std_ + mean_).clamp(0, 1)
    gray = torch.einsum("bchw,c->bhw", rgb, torch.tensor(_GRAY, dtype=x.dtype, device=x.device))
    strength = min_max(saliency.upsample("bilinear").to(x.device, x.dtype))
    return SaliencyResult(
        maps=gray * strength,
        method=f"{saliency.method}+modulated_gray",
        image_size=saliency.image_size,
        options={**saliency.options, "upsample": "bilinear", "normalize": "min-max"},
        targets=saliency.targets,
        extras={"gray": gray, "strength": strength},
    )
