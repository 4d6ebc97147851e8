"""torchvision's MaxViT (``maxvit_t``; Tu et al. 2022): a stride-2 stem, then stages
``blocks.{s}`` of layers ``blocks.{s}.layers.{i}``, each an MBConv (the first of a stage with
stride 2) followed by two ``PartitionAttentionLayer`` blocks, ``layers.window_attention`` (block
attention in p x p windows) and ``layers.grid_attention`` (grid attention over a dilated p x p
grid). Every convolution is padded, so each stride-2 step maps r -> (r - 1) // 2 + 1.

A ``PartitionAttentionLayer`` takes and returns (B, C, gh, gw) and runs its two branches on the
partitioned stream (B, G, P², C): ``x + stochastic_dropout(attn_layer(x))``,
``x + stochastic_dropout(mlp_layer(x))``, one ``stochastic_dropout`` closing both (its first and
second call). Its branch names are therefore read in the partitioned layout and put back on the
stage grid as (B, Np, C) (for grid attention after swapping the windows and tokens back).

``RelativePositionalMultiHeadAttention`` (``attn_layer.1``) applies its softmax inline, handing
the map to no module, so the map is recomputed from its input as its forward computes it:
softmax(q (k · C^-1/2)ᵀ + relative position bias), (B·G, H, P², P²) in torchvision's window
order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from ...hooks.family import AttentionContext, BlockSite, Family, FamilyLayout, register_family
from ...hooks.readers import ComputedReader, InputReader, NthCall
from ...hooks.taps import GridFn, Tap
from ...hooks.windows import WindowGeometry
from ..grids import conv_grid, halved

__all__ = ["layout", "maxvit_position_bias", "maxvit_window_pattern"]

_MAXVIT = "torchvision.models.maxvit"
_PARTS = ("window_attention", "grid_attention")


def layout(model: nn.Module) -> FamilyLayout:
    """``MaxVit``: every ``PartitionAttentionLayer`` a block on its stage's grid."""
    stem = conv_grid(model.stem[0][0])  # the stride-2 stem convolution
    blocks: list[BlockSite] = []
    extra: list[Tap] = []
    for s, stage in enumerate(model.blocks):
        grid = halved(stem, s + 1)  # the stage's first MBConv has stride 2
        for i, layer in enumerate(stage.layers):
            for part in _PARTS:
                path = f"blocks.{s}.layers.{i}.layers.{part}"
                blocks.append(
                    BlockSite(path, tokens="Np", prefix_tokens=0, grid=grid, channels_first=True)
                )
                extra += _branch_taps(path, getattr(layer.layers, part), grid)
        extra.append(Tap(f"blocks.{s}.hook_out", f"blocks.{s}", shape="B C gh gw"))
    return FamilyLayout("maxvit", blocks, extra, reads_class_token=False)


def _branch_taps(path: str, block: nn.Module, grid: GridFn) -> list[Tap]:
    """``hook_attn_out``, ``hook_resid_mid`` and ``hook_mlp_out`` of one partition block, read in
    its partitioned layout and held as (B, Np, C) on the stage grid."""
    views = _departitioned(block)
    common = {"shape": "B Np C", "prefix_tokens": 0, "grid": grid, **views}
    return [
        Tap(f"{path}.hook_attn_out", f"{path}.stochastic_dropout", NthCall(0, block), **common),
        Tap(f"{path}.hook_resid_mid", f"{path}.mlp_layer", InputReader(), **common),
        Tap(f"{path}.hook_mlp_out", f"{path}.stochastic_dropout", NthCall(1, block), **common),
    ]


def _departitioned(block: nn.Module) -> dict[str, Callable]:
    """``to_canonical`` / ``from_canonical`` between the block's partitioned stream (B, G, P², C)
    (grid attention: (B, P², G, C)) and (B, Np, C) in raster order, as its departition does."""
    swapped = block.partition_type == "grid"

    def sides() -> tuple[int, int, int]:
        p = block.p
        return p, block.grid_size[0] // p, block.grid_size[1] // p

    def to_nlc(t: Tensor) -> Tensor:
        if t.ndim != 4:
            return t
        t = t.transpose(-2, -3) if swapped else t
        p, hp, wp = sides()
        batch, channels = t.shape[0], t.shape[-1]
        t = t.reshape(batch, hp, wp, p, p, channels).permute(0, 1, 3, 2, 4, 5)
        return t.reshape(batch, hp * p * wp * p, channels)

    def from_nlc(new: Tensor, raw: Tensor) -> Tensor:
        if raw.ndim != 4:
            return new
        p, hp, wp = sides()
        batch, channels = new.shape[0], new.shape[-1]
        t = new.reshape(batch, hp, p, wp, p, channels).permute(0, 1, 3, 2, 4, 5)
        t = t.reshape(batch, hp * wp, p * p, channels)
        return (t.transpose(-2, -3) if swapped else t).reshape(raw.shape)

    return {"to_canonical": to_nlc, "from_canonical": from_nlc}


def maxvit_window_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B·G, H, P², P²): the map a ``RelativePositionalMultiHeadAttention`` call computed on its
    input (B, G, P², C), as its forward computes it (the key scaled by C^-1/2, C the feature
    width, not the head width)."""
    x = args[0] if args else kwargs["x"]
    batch, groups, tokens, _ = x.shape
    heads, head_dim = attn.n_heads, attn.head_dim
    q, k, _ = attn.to_qkv(x).chunk(3, dim=-1)
    q = q.reshape(batch, groups, tokens, heads, head_dim).permute(0, 1, 3, 2, 4)
    k = k.reshape(batch, groups, tokens, heads, head_dim).permute(0, 1, 3, 2, 4)
    logits = q @ (k * attn.scale_factor).transpose(-2, -1)
    pattern = (logits + attn.get_relative_positional_bias()).softmax(-1)
    return pattern.flatten(0, 1)


def maxvit_position_bias(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H, P², P²): the relative position bias added to every window's logits."""
    return attn.get_relative_positional_bias()[0]


def _window_site(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``hook_pattern`` (recomputed, read-only) and ``hook_pos_bias``. Block attention: p x p
    windows; grid attention: a dilated grid of p x p tokens (`WindowGeometry.dilated`)."""
    block = context.block
    if block is None or not hasattr(block, "partition_type"):
        return []
    size = (attn.size, attn.size)  # tokens per window side: partition_size in both cases

    def geometry() -> WindowGeometry:
        return WindowGeometry(size, dilated=block.partition_type == "grid")

    return [
        Tap(f"{path}.hook_pattern", path, ComputedReader(maxvit_window_pattern), kind="window",
            shape="B·nW H w² w²", prefix_tokens=context.prefix_tokens, grid=context.grid,
            geometry=geometry),
        Tap(f"{path}.hook_pos_bias", path, ComputedReader(maxvit_position_bias), kind="position",
            shape="H w² w²"),
    ]  # fmt: skip


FAMILY = register_family(
    Family(
        "maxvit",
        "torchvision",
        models={f"{_MAXVIT}:MaxVit": layout},
        attention={f"{_MAXVIT}:RelativePositionalMultiHeadAttention": _window_site},
    )
)
