"""A ViT with a known register neuron, to check the test-time register pipeline on (the tests,
the guide and notebook 07 use it): the small models vizkit trains write no high-norm artifacts,
and the large models that do (DINOv2-L, CLIP-L; Darcet et al. 2024, "Vision Transformers Need
Registers", Fig. 2) cannot be downloaded here.

The model is random except for the planted mechanism, the one Jiang et al. (2025, "Vision
Transformers Don't Need Trained Registers", Sec. 3) find in large ViTs: one sparse MLP neuron
fires on a few patches (here: bright ones) and writes a large vector there, and the later blocks'
attention is drawn to the tokens that carry it.
"""

from __future__ import annotations

import timm
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["PLANTED_NEURON", "bright_patch_images", "planted_register_vit"]

PLANTED_NEURON = (1, 7)  # (block, MLP neuron) of the planted register neuron
_WIDTH, _SIZE, _PATCH = 64, 32, 8
_GAIN = 20.0  # norm of the vector the neuron writes per unit of activation


def planted_register_vit(seed: int = 0) -> nn.Module:
    """A timm ViT (4 blocks, width 64, 32 px images in 4 x 4 patches, 10 classes, random
    weights) in which MLP neuron 7 of block 1 fires on bright patches and writes
    ``20 * activation`` along a unit vector u; every later block's keys read u and every query
    has a bias along the same key direction, so the tokens that carry u draw the attention.
    In eval mode."""
    torch.manual_seed(seed)
    shape = {"img_size": _SIZE, "patch_size": _PATCH, "depth": 4, "embed_dim": _WIDTH}
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, num_heads=2, **shape)
    layer, neuron = PLANTED_NEURON
    u = F.normalize(torch.randn(_WIDTH), dim=0)
    with torch.no_grad():
        model.patch_embed.proj.weight[0] = 0.05  # channel 0 reads the patch's brightness
        model.patch_embed.proj.bias[0] = 0.0
        mlp = model.blocks[layer].mlp
        mlp.fc1.weight[neuron] = 0
        mlp.fc1.weight[neuron, 0] = 2.0 / model.blocks[layer].norm2.weight[0]
        mlp.fc1.bias[neuron] = -6.0  # silent (GELU ~ 0) unless channel 0 stands out
        mlp.fc2.weight[:, neuron] = _GAIN * u
        for block in model.blocks[layer + 1 :]:
            qkv = block.attn.qkv
            key = F.normalize(torch.randn(_WIDTH), dim=0)
            qkv.weight[_WIDTH : 2 * _WIDTH] += 3.0 * torch.outer(key, u)
            qkv.bias[:_WIDTH] += 3.0 * key
    return model.eval()


def bright_patch_images(count: int, seed: int = 1) -> tuple[Tensor, Tensor]:
    """(count, 3, 32, 32) standard-normal noise images, each with one patch set to 3 (bright),
    and the bright patch's index (count,) in the 4 x 4 grid, row-major."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 3, _SIZE, _SIZE, generator=generator)
    side = _SIZE // _PATCH
    where = torch.randint(0, side * side, (count,), generator=generator)
    for i, k in enumerate(where.tolist()):
        r, c = divmod(k, side)
        x[i, :, r * _PATCH : (r + 1) * _PATCH, c * _PATCH : (c + 1) * _PATCH] = 3.0
    return x, where
