"""open_clip's ``VisionTransformer`` (the ``visual`` tower of its CLIP models): pre-norm
``ResidualAttentionBlock``s ``transformer.resblocks.{i}`` over [class, patches] with torch's
``nn.MultiheadAttention`` (`vizkit.families.torch.multihead_attention`) and optional LayerScale
``ls_1``/``ls_2``. The stream must be batch-first (open_clip's default)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.layout import TokenLayout
from ...hooks.taps import Tap

__all__ = ["layout"]

_TRANSFORMER = "open_clip.transformer"


def layout(model: nn.Module) -> FamilyLayout:
    if not getattr(model.transformer, "batch_first", True):
        raise ValueError(
            "This open_clip VisionTransformer runs its blocks sequence-first (batch_first="
            "False), so their tokens are not (B, N, C); vizkit reads batch-first towers only. "
            "Build it with batch_first=True (open_clip's default)."
        )
    blocks = [
        BlockSite(f"transformer.resblocks.{i}") for i in range(len(model.transformer.resblocks))
    ]
    ph, pw = model.patch_size
    pooled_norm = getattr(model, "final_ln_after_pool", False) or model.attn_pool is not None
    extra = [] if pooled_norm else [Tap("hook_final_norm", "ln_post", shape="B N C")]

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(1, (image_size[0] // ph, image_size[1] // pw), True)

    reads_class = model.attn_pool is None and getattr(model, "pool_type", "tok") == "tok"
    return FamilyLayout(
        "vit", blocks, extra, tokens=tokens, reads_class_token=reads_class,
        readout=_readout(model),
    )  # fmt: skip


def _readout(model: nn.Module) -> Callable[[Tensor], Tensor] | None:
    """The tower's pooling and projection on the last block's tokens (open_clip's ``_pool``,
    then ``proj``); None where open_clip has no ``_pool`` (before 3.1)."""
    pool = getattr(model, "_pool", None)
    if pool is None:
        return None

    def readout(tokens: Tensor) -> Tensor:
        pooled = pool(tokens)[0]
        return pooled if model.proj is None else pooled @ model.proj

    return readout


FAMILY = register_family(
    Family(
        "vit",
        "open_clip",
        models={f"{_TRANSFORMER}:VisionTransformer": layout},
        # x + ls_1(attn(ln_1(x))); x + ls_2(mlp(ln_2(x)))
        blocks={
            f"{_TRANSFORMER}:ResidualAttentionBlock": ResidualSpec(
                "ls_1", "ls_2", "ln_2", scales=("ls_1.gamma", "ls_2.gamma")
            )
        },
    )
)
