"""The latents of a batch of rows kept as their non-zero entries, for the passes over a whole
store (`features`, `evaluate_sae`, `mask_share`): a TopK code has k non-zero latents of
thousands per row, so its statistics and its reconstruction (a weighted sum of k decoder rows,
an embedding bag: Gao et al. 2024, "Scaling and evaluating sparse autoencoders", App. D) cost
rows x k, not rows x latents, beside the encoder's one dense product."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .autoencoder import SparseAutoencoder

__all__ = ["SparseLatents", "sparse_latents"]

DENSE_DECODE = 1 / 16  # above this share of non-zero latents, decode by one dense product


@dataclass(frozen=True)
class SparseLatents:
    """The non-zero latents of ``count`` rows, row by row: ``row``, ``latent`` and ``value``
    (nnz,), ``row`` non-decreasing."""

    row: Tensor
    latent: Tensor
    value: Tensor
    count: int

    def dense(self, latents: int) -> Tensor:
        """(count, latents) the code as `SparseAutoencoder.encode` returns it."""
        z = self.value.new_zeros(self.count, latents)
        return z.index_put_((self.row, self.latent), self.value)

    def decode(self, sae: SparseAutoencoder) -> Tensor:
        """(count, width) ``sae.decode`` of the code: the weighted sum of each row's decoder
        rows, or one dense product where more than `DENSE_DECODE` of the latents are on."""
        if len(self.value) > DENSE_DECODE * self.count * sae.latents:
            return sae.decode(self.dense(sae.latents))
        offsets = torch.searchsorted(self.row, torch.arange(self.count, device=self.row.device))
        summed = F.embedding_bag(self.latent, sae.W_dec, offsets, mode="sum",
                                 per_sample_weights=self.value)  # fmt: skip
        return (summed + sae.b_dec) / sae.input_scale

    def fired(self, latents: int) -> Tensor:
        """(latents,) float64 how many of the rows each latent is non-zero on."""
        return torch.bincount(self.latent, minlength=latents).double()

    def per_latent(self, values: Tensor, latents: int, reduce: str = "sum") -> Tensor:
        """(latents,) ``values`` (nnz,) reduced over each latent's entries ("sum" or "amax";
        0 for a latent with none)."""
        out = values.new_zeros(latents)
        return out.scatter_reduce_(0, self.latent, values, reduce)

    def image_max(self, tokens: int, latents: int) -> Tensor:
        """(count / tokens, latents) each latent's largest value over each image's ``tokens``
        consecutive rows (0 where it does not fire)."""
        images = self.count // tokens
        flat = (self.row // tokens) * latents + self.latent
        out = self.value.new_zeros(images * latents)
        return out.scatter_reduce_(0, flat, self.value, "amax").view(images, latents)


def sparse_latents(sae: SparseAutoencoder, x: Tensor) -> SparseLatents:
    """The non-zero entries of ``sae.encode(x)`` for rows ``x`` (n, width), equal to them: for
    kind "topk" from the top k of each row's pre-activations, never made dense."""
    if sae.kind == "topk" and not sae.training:
        top = sae.pre_activations(x).relu_().topk(sae.k, dim=-1)
        on = top.values > 0
        rows = torch.arange(len(x), device=x.device)[:, None].expand_as(on)
        return SparseLatents(rows[on], top.indices[on], top.values[on], len(x))
    z = sae.encode(x)
    row, latent = z.nonzero(as_tuple=True)
    return SparseLatents(row, latent, z[row, latent], len(x))
