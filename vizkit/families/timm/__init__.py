"""timm's families, one module each (importing this package registers them)."""

from . import (
    beit,
    bottleneck_attn,
    cait,
    coat,
    convit,
    crossvit,
    efficientformer,
    efficientvit_msra,
    eva,
    hiera,
    hieradet_sam2,
    levit,
    lowformer,
    maxvit,
    mvitv2,
    naflexvit,
    pit,
    relpos,
    shvit,
    swin,
    tiny_vit,
    twins,
    vit,
    xcit,
)

__all__ = [
    "beit", "bottleneck_attn", "cait", "coat", "convit", "crossvit", "efficientformer",
    "efficientvit_msra", "eva", "hiera", "hieradet_sam2", "levit", "lowformer", "maxvit",
    "mvitv2", "naflexvit", "pit", "relpos", "shvit", "swin", "tiny_vit", "twins", "vit", "xcit",
]  # fmt: skip
