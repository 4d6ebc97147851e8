"""Hugging Face transformers' SigLIP 2 vision tower (``Siglip2VisionModel``, also inside
``Siglip2ForImageClassification`` and ``Siglip2Model``): SigLIP's blocks ``encoder.layers.{i}``
over the patches alone (no class token), its attention-pooling head an ``nn.MultiheadAttention``
(`vizkit.families.torch`).

SigLIP 2 takes its images as patches, (B, N, p·p·C) with ``spatial_shapes`` and a padding mask
(its NaFlex input). vizkit's analyses take images (B, C, H, W): `Siglip2Images` turns them into
the patches SigLIP 2's image processor makes (raster order, each patch flattened channels
last), so the tokens are an (H / p, W / p) raster grid."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ...hooks.layout import TokenLayout
from ...hooks.taps import Tap
from .clip import CLIP_LAYER
from .common import returned_map

__all__ = ["Siglip2Images", "layout"]

_SIGLIP2 = "transformers.models.siglip2.modeling_siglip2"


class Siglip2Images(nn.Module):
    """A SigLIP 2 model that takes images: ``forward(x)`` with x (B, C, H, W), H and W
    multiples of the patch size, calls ``model(pixel_values=patches, pixel_attention_mask=ones,
    spatial_shapes=(H / p, W / p))`` and returns its output (logits of
    ``Siglip2ForImageClassification``, a ``ModelOutput`` otherwise)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        config = getattr(model.config, "vision_config", model.config)
        self.model, self.patch = model, int(config.patch_size)
        self.channels = int(config.num_channels)

    def forward(self, x: Tensor):
        batch, channels, height, width = x.shape
        p = self.patch
        if channels != self.channels or height % p or width % p:
            raise ValueError(
                f"SigLIP 2 takes (B, {self.channels}, H, W) images with H and W multiples of its "
                f"patch size {p}; got {tuple(x.shape)}. Resize the images (vk.datasets."
                "load_images) or pass the processor's patches to the model itself."
            )
        rows, cols = height // p, width // p
        patches = x.reshape(batch, channels, rows, p, cols, p).permute(0, 2, 4, 3, 5, 1)
        patches = patches.reshape(batch, rows * cols, p * p * channels)
        shapes = torch.tensor([[rows, cols]], device=x.device).expand(batch, 2)
        mask = torch.ones(batch, rows * cols, dtype=torch.long, device=x.device)
        return self.model(pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=shapes)


def layout(model: nn.Module) -> FamilyLayout:
    blocks = [BlockSite(f"encoder.layers.{i}") for i in range(len(model.encoder.layers))]
    patch = int(model.config.patch_size)

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(0, (image_size[0] // patch, image_size[1] // patch), False)

    extra = [Tap("hook_final_norm", "post_layernorm", shape="B N C")]
    return FamilyLayout("siglip2", blocks, extra, tokens=tokens, reads_class_token=False)


FAMILY = register_family(
    Family(
        "siglip2",
        "transformers",
        models={f"{_SIGLIP2}:Siglip2VisionModel": layout},
        blocks={f"{_SIGLIP2}:Siglip2EncoderLayer": CLIP_LAYER},
        attention={f"{_SIGLIP2}:Siglip2Attention": returned_map},
    )
)
