"""torchvision's ``VisionTransformer`` (``vit_b_16`` ...): pre-norm ``EncoderBlock``s
``encoder.layers.encoder_layer_{i}`` over [class, patches]; their ``nn.MultiheadAttention``
maps via `vizkit.families.torch.multihead_attention`. The model takes exactly
``model.image_size`` images; the head reads the class token."""

from __future__ import annotations

from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.layout import TokenLayout
from ...hooks.taps import Tap

__all__ = ["layout"]

_VIT = "torchvision.models.vision_transformer"


def layout(model: nn.Module) -> FamilyLayout:
    blocks = [
        BlockSite(f"encoder.layers.{name}") for name, _ in model.encoder.layers.named_children()
    ]
    extra = [Tap("hook_final_norm", "encoder.ln", shape="B N C")]
    patch = model.patch_size

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(1, (image_size[0] // patch, image_size[1] // patch), True)

    def readout(block_tokens):  # the encoder's final norm, the class token, the heads
        return model.heads(model.encoder.ln(block_tokens)[:, 0])

    return FamilyLayout(
        "vit", blocks, extra, tokens=tokens, reads_class_token=True, readout=readout
    )


FAMILY = register_family(
    Family(
        "vit",
        "torchvision",
        models={f"{_VIT}:VisionTransformer": layout},
        # x + dropout(self_attention(ln_1(x))); x + mlp(ln_2(x))
        blocks={f"{_VIT}:EncoderBlock": ResidualSpec("dropout", "mlp", "ln_2")},
    )
)
