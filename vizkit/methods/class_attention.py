"""Class-attention saliency: where the class token looks (CaiT, "Going deeper with Image
Transformers", Fig. 6 and 7; ViT's last class-token row; a pooling head's latent queries)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.class_token import class_rows
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.heads import HeadSpec, head_option, reduce_heads
from ..hooks.inputs import check_images
from ..hooks.selector import LayerSpec, select_layer
from .registry import saliency_method

__all__ = ["class_attention"]


@saliency_method(
    "class_attention", needs=("attention",), targets=False, default=True,
    summary="the class token's attention over the patches (CaiT Fig. 6/7)",
)  # fmt: skip
@analysis_contract
def class_attention(
    model: nn.Module | HookedModel,
    x: Tensor,
    layer: LayerSpec | None = None,
    heads: HeadSpec = "mean",
) -> SaliencyResult:
    """Where the class token (or a pooling head's latent query) looks over the patches.

    - A class-attention stage (CaiT, XCiT): the rows of class-attention layer ``layer``
      (default 0, the layer CaiT's Fig. 7 shows).
    - A class token in self-attention (ViT, DeiT, DINOv2/v3, EVA, BEiT, PiT, CrossViT's
      branches): its row in self-attention layer ``layer`` (default the last).
    - No class token but an attention-pooling head (SigLIP's MAP head): the head's map, latent
      queries averaged; ``layer`` must be None or 0.

    ``layer`` is an int counting those layers (negative from the end), a hook name or a module
    path (``"blocks_token_only.1"``); ``heads`` fuses the heads of ``maps`` (`reduce_heads`).

    Returns:
        `SaliencyResult`: maps (B, gh, gw) = the patch weights, heads fused by ``heads``;
            options ``layer`` (hook name), ``layer_index``, ``stage``, ``heads``; extras
            ``per_head`` (B, H, gh, gw), ``prefix_mass`` (B, H), the weight on the prefix tokens
            (class, registers) left out of the maps, not renormalized away, and (with a class
            token) ``cls_self`` (B, H), its weight on itself.

    Raises:
        ValueError: a model with neither a class token nor a pooling head (Swin, Twins: use
            rollout() or gradcam()), or a layer out of range.
    """
    hm = as_hooked(model)
    x = check_images(hm.model, x)
    image_size = tuple(x.shape[-2:])
    names, stage, default = class_rows(hm, image_size)
    name = select_layer(default if layer is None else layer, names, what=f"{stage} layers")
    layout = hm.token_layout(image_size, name)
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=name)
    row = cache[name].mean(2) if stage == "pooling-head" else cache[name][:, :, 0]  # (B, H, N)
    prefix, patches = layout.split(row, dim=-1)
    per_head = layout.to_grid(patches)
    return SaliencyResult(
        maps=reduce_heads(per_head, heads, head_dim=1),
        method="class_attention",
        image_size=image_size,
        options={
            "layer": name,
            "layer_index": names.index(name),
            "stage": stage,
            "heads": head_option(heads),
        },
        layout=layout,
        targets=None,  # class-agnostic: the same map whichever class is scored
        extras={
            "per_head": per_head,
            "prefix_mass": prefix.sum(-1),
            **({} if stage == "pooling-head" else {"cls_self": prefix[..., 0]}),
        },
    )
