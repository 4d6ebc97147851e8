"""A masked autoencoder's encoder with every patch, in raster order (He et al. 2022, "Masked
Autoencoders Are Scalable Vision Learners", Sec. 3: the encoder sees a random 25 % of the
patches, shuffled): for explaining what it learned, the whole image is what it should see."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["UnmaskedMAE", "unmasked_mae"]


class UnmaskedMAE(nn.Module):
    """A transformers ``ViTMAEModel`` run with ``mask_ratio`` 0 and the identity shuffle (its
    ``noise`` argument in increasing order), so that its tokens are [class, patches] in raster
    order and every analysis reads them on the patch grid. The model is unchanged: its
    ``mask_ratio`` is restored after each call, also after an error.

    Args:
        model: a ``ViTMAEModel`` (or a module with ``config.mask_ratio`` and
            ``embeddings.patch_embeddings`` that takes ``noise=``).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> object:
        """(B, C, H, W) images -> the model's output, on every patch in raster order."""
        config = self.model.embeddings.config
        ph, pw = _pair(self.model.embeddings.patch_embeddings.patch_size)
        tokens = (x.shape[-2] // ph) * (x.shape[-1] // pw)
        noise = torch.arange(tokens, device=x.device, dtype=torch.float32).expand(len(x), -1)
        before = config.mask_ratio
        config.mask_ratio = 0.0
        try:
            return self.model(pixel_values=x, noise=noise)
        finally:
            config.mask_ratio = before


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else tuple(size)


def unmasked_mae(model: nn.Module) -> nn.Module:
    """`UnmaskedMAE` in eval mode: ``vk.attention(vk.models.unmasked_mae(mae), x)``."""
    return UnmaskedMAE(model).eval()
