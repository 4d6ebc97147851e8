"""The terms of a sparse autoencoder's training loss, on rows in the autoencoder's input scale.

- `normalized_mse`: the squared error divided by that of always predicting the batch mean (the
  fraction of variance unexplained; Gao et al. 2024, "Scaling and evaluating sparse
  autoencoders", Sec. 2.1 reports every MSE normalized so);
- `auxk_loss`: Gao et al.'s auxiliary loss (Appendix A.2), the residual reconstructed by the
  ``k_aux`` largest dead latents, which gives dead latents a gradient;
- `l1_penalty`: the ReLU baseline's sparsity term, each latent weighted by its decoder row's
  norm (Bricken et al. 2023, "Towards Monosemanticity"; Anthropic's April 2024 update);
- `matryoshka_loss`: the normalized MSE of each prefix of the dictionary's reconstruction,
  averaged (Bussmann et al. 2025, "Learning Multi-Level Features with Matryoshka Sparse
  Autoencoders", Sec. 3: the sum over prefixes; the mean keeps the scale of one term).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["auxk_loss", "l1_penalty", "matryoshka_loss", "normalized_mse"]


def normalized_mse(reconstruction: Tensor, x: Tensor) -> Tensor:
    """() ``sum ||x_hat - x||^2 / sum ||x - mean(x)||^2`` over rows (B, width)."""
    error = (reconstruction - x).square().sum()
    spread = (x - x.mean(0)).square().sum()
    return error / spread.clamp_min(torch.finfo(x.dtype).tiny)


def auxk_loss(pre: Tensor, dead: Tensor, residual: Tensor, W_dec: Tensor, k_aux: int) -> Tensor:
    """() the normalized MSE of the ``residual`` (B, width) ``x - x_hat`` (held fixed)
    against its reconstruction from the ``k_aux`` largest of ``ReLU(pre)`` (B, latents) among
    the ``dead`` latents (latents,) bool, through the decoder rows ``W_dec`` (latents, width)
    without bias; 0 when none is dead."""
    count = min(k_aux, int(dead.sum()))
    if count == 0:
        return pre.new_zeros(())
    candidates = pre.relu().masked_fill(~dead, 0.0)
    top = candidates.topk(count, dim=-1)
    z_aux = torch.zeros_like(candidates).scatter(-1, top.indices, top.values)
    return normalized_mse(z_aux @ W_dec, residual)


def l1_penalty(z: Tensor, W_dec: Tensor) -> Tensor:
    """() the mean over rows of ``sum_i z_i ||W_dec_i||`` (z: (B, latents))."""
    return (z.abs() * W_dec.norm(dim=1)).sum(-1).mean()


def matryoshka_loss(
    z: Tensor, W_dec: Tensor, b_dec: Tensor, x: Tensor, prefixes: list[int]
) -> Tensor:
    """() the mean over ``prefixes`` p of the normalized MSE of ``z[:, :p] W_dec[:p] + b_dec``
    against ``x`` (B, width); z (B, latents), W_dec (latents, width)."""
    terms = [normalized_mse(z[:, :p] @ W_dec[:p] + b_dec, x) for p in prefixes]
    return torch.stack(terms).mean()
