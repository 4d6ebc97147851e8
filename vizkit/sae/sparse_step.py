"""A TopK autoencoder's training losses with sparse gradients: only k of a row's latents (and
AuxK's k_aux) are non-zero, so the decoder is a weighted sum of k decoder rows (an embedding
bag) and the encoder's gradient reaches k columns per row, as Gao et al. (2024, "Scaling and
evaluating sparse autoencoders", Sec. 5 and App. D: sparse kernels) compute them. The encoder's
forward stays one dense product (every pre-activation is needed to choose the top k); its
backward and the decoder's forward and backward cost B k width instead of B latents width.
Equal, to float rounding, to the dense losses of `vizkit.sae.training`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .autoencoder import SparseAutoencoder

__all__ = ["SparseCode", "sparse_code"]


@dataclass
class SparseCode:
    """A batch's top-k latents: ``indices`` and ``values`` (B, k), and AuxK's among the dead
    latents, ``aux_indices`` and ``aux_values`` (B, k_aux; k_aux 0 where none is dead)."""

    indices: Tensor
    values: Tensor
    aux_indices: Tensor
    aux_values: Tensor

    def decode(self, W_dec: Tensor, aux: bool = False) -> Tensor:
        """(B, width) sum_j values[:, j] W_dec[indices[:, j]] (AuxK's with ``aux``), no bias."""
        indices, values = (self.aux_indices, self.aux_values) if aux else (self.indices,
                                                                          self.values)  # fmt: skip
        return F.embedding_bag(indices, W_dec, per_sample_weights=values, mode="sum")

    def fired(self, latents: int) -> Tensor:
        """(latents,) bool: the latents that fired on some row."""
        fired = torch.zeros(latents, dtype=torch.bool, device=self.indices.device)
        fired[self.indices[self.values > 0]] = True
        return fired


def sparse_code(sae: SparseAutoencoder, x: Tensor, dead: Tensor, k_aux: int) -> SparseCode:
    """The top-k code of rows ``x`` (B, width, in the autoencoder's scale) and AuxK's top
    ``k_aux`` among the ``dead`` latents (latents,) bool, differentiable in the encoder's
    weights and biases (sparse gradients)."""
    count = min(k_aux, int(dead.sum()))
    values, indices, aux_values, aux_indices = _TopK.apply(
        x - sae.b_dec, sae.W_enc, sae.b_enc, sae.k, dead, count
    )
    return SparseCode(indices, values, aux_indices, aux_values)


class _TopK(torch.autograd.Function):
    """(values, indices) of the k largest of ReLU(centred @ W_enc + b_enc) per row, and of the
    ``count`` largest among the ``dead`` latents; the backward scatters their gradients into
    the k (and count) chosen columns only."""

    @staticmethod
    def forward(ctx, centred, W_enc, b_enc, k, dead, count):  # noqa: ANN001
        positive = torch.addmm(b_enc, centred, W_enc).relu_()  # (B, latents)
        values, indices = positive.topk(k, dim=-1)
        if count:
            aux_values, aux_indices = positive.masked_fill_(~dead, 0.0).topk(count, dim=-1)
        else:
            aux_values = centred.new_zeros(len(centred), 0)
            aux_indices = indices.new_zeros(len(centred), 0)
        ctx.mark_non_differentiable(indices, aux_indices)
        ctx.save_for_backward(centred, W_enc, indices, values > 0, aux_indices, aux_values > 0)
        return values, indices, aux_values, aux_indices

    @staticmethod
    def backward(ctx, grad_values, _indices, grad_aux, _aux_indices):  # noqa: ANN001
        centred, W_enc, indices, on, aux_indices, aux_on = ctx.saved_tensors
        grad_values = (
            torch.zeros_like(on, dtype=centred.dtype) if grad_values is None else grad_values
        )
        grad_aux = torch.zeros_like(aux_on, dtype=centred.dtype) if grad_aux is None else grad_aux
        rows = torch.arange(len(centred), device=centred.device)[:, None]
        columns = torch.cat([indices, aux_indices], 1)
        grads = torch.cat([grad_values * on, grad_aux * aux_on], 1)  # ReLU's gradient
        where = torch.stack([rows.expand_as(columns).flatten(), columns.flatten()])
        shape = (len(centred), W_enc.shape[1])
        sparse = torch.sparse_coo_tensor(where, grads.flatten(), shape, check_invariants=False)
        sparse = sparse.coalesce()
        grad_b_enc = torch.zeros_like(W_enc[0]).index_add_(0, columns.flatten(), grads.flatten())
        grad_W_enc = torch.sparse.mm(sparse.t(), centred).T  # (width, latents)
        grad_centred = torch.sparse.mm(sparse, W_enc.T)
        return grad_centred, grad_W_enc, grad_b_enc, None, None, None
