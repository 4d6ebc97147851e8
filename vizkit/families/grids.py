"""Token-grid functions for `BlockSite.grid`: image size (H, W) -> a stage's token grid."""

from __future__ import annotations

from torch import nn

from ..hooks.taps import GridFn

__all__ = ["conv_grid", "divided", "halved", "scaled_patch_grid"]


def scaled_patch_grid(model: nn.Module, scale: int) -> GridFn:
    """The grid of ``model.patch_embed`` (timm) for an input size, divided by ``scale``
    (rounded up)."""
    pe = model.patch_embed

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        if getattr(pe, "strict_img_size", True) and not getattr(model, "dynamic_img_size", False):
            base = pe.grid_size
        else:
            base = pe.dynamic_feat_size(tuple(image_size))
        return tuple(-(-int(g) // scale) for g in base)

    return grid


def conv_grid(conv: nn.Conv2d, scale: int = 1) -> GridFn:
    """The output grid of ``conv`` for an input size, divided by ``scale`` (rounded up)."""

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        out = [
            (size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, k, s, p, d in zip(
                image_size, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
                strict=True,
            )
        ]  # fmt: skip
        return tuple(-(-o // scale) for o in out)

    return grid


def divided(stride: int, ceil: bool = False) -> GridFn:
    """The image size divided by ``stride`` (rounded down, or up with ``ceil``)."""

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        return tuple(
            -(-int(size) // stride) if ceil else int(size) // stride for size in image_size
        )

    return grid


def halved(base: GridFn, times: int, stride: int = 2) -> GridFn:
    """``base`` divided by ``stride`` ``times``, rounding up (a padded stride-s convolution or
    subsampling: r -> (r - 1) // s + 1)."""

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        out = base(image_size)
        for _ in range(times):
            out = tuple((g - 1) // stride + 1 for g in out)
        return out

    return grid
