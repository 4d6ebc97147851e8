"""CrossViT (Chen et al. 2021): per multi-scale block, each branch's ViT blocks over
[class, patches]; the fusion's cross attention (one branch's class token over the other
branch's tokens) is read outside the blocks."""

from __future__ import annotations

from timm.models import crossvit

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ...hooks.sites import captured
from ...hooks.taps import GridFn

__all__ = ["layout"]


def layout(model: crossvit.CrossVit) -> FamilyLayout:
    blocks = []
    for m, multi in enumerate(model.blocks):
        for b, branch in enumerate(multi.blocks):
            pe = model.patch_embed[b]
            grid = _branch_grid(
                model, b, [s // p for s, p in zip(pe.img_size, pe.patch_size, strict=True)]
            )
            blocks += [
                BlockSite(f"blocks.{m}.blocks.{b}.{i}", prefix_tokens=1, grid=grid)
                for i in range(len(branch))
            ]
    return FamilyLayout("crossvit", blocks, [])


def _branch_grid(model: crossvit.CrossVit, branch: int, size) -> GridFn:
    """A branch's fixed grid. The model resizes the image to the branch's size, so the grid
    covers the whole image, except with ``crop_scale``, where it covers only a centre crop."""
    fixed = tuple(int(s) for s in size)
    scaled = tuple(model.img_size_scaled[branch])

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        if model.crop_scale and tuple(image_size) != scaled:
            raise ValueError(
                f"CrossViT with crop_scale=True shows branch {branch} only the centre "
                f"{scaled[0]}x{scaled[1]} crop of a {image_size[0]}x{image_size[1]} image, so its "
                f"tokens cannot be drawn over the whole image; use {scaled[0]}x{scaled[1]} images."
            )
        return fixed

    return grid


FAMILY = register_family(
    Family(
        "crossvit",
        "timm",
        models={crossvit.CrossVit: layout},
        attention={crossvit.CrossAttention: captured("cross")},
        outside_blocks=(crossvit.CrossAttention,),
    )
)
