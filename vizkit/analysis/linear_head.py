"""A model's head made linear: with its norms' scales (and an attention-pooling head's map)
frozen at their clean values, the head maps the last block's stream s (B, N, C) to
J_b(s) = sum_k M_bk (sum_q w_bkq s_q) plus a constant, K pooled reads of the stream each
through a (D, C) map, D the embedding's width or the classes. A head that reads the class token
is one read (w one-hot, M its Jacobian there, for every output at once); SigLIP's pooling head
is one read per pooling head (`vizkit.text.pooling`). The embedding decomposition reads each
head's direct term through it (Gandelsman et al. 2024, Sec. 3: the head "P" applied to each
term, `vizkit.text.head_values`), the latents' logit effects each decoder direction
(`vizkit.sae.effects`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..hooks.gradient_graph import frozen_parameters
from ..targets import embedding_of
from .residual_stream import StreamReadout

__all__ = ["LinearHead", "first_tokens_head"]


@dataclass
class LinearHead:
    """J_b(s) = sum_k maps[b, k] @ (sum_q weights[b, k, q] s_q).

    Attributes:
        weights: (B, K, N) how each read pools the stream's tokens.
        maps: (B, K, D, C), or (1, K, D, C) where every image shares them.
    """

    weights: Tensor
    maps: Tensor

    def __post_init__(self) -> None:
        # shared maps as one (K C, D) matrix, so a read is one matrix product
        shared = self.maps[0].permute(0, 2, 1).flatten(0, 1) if len(self.maps) == 1 else None
        self._shared = None if shared is None else shared.contiguous()

    def __call__(self, streams: Tensor) -> Tensor:
        """(B, P, D) the linear part of the head on streams (P, B, N, C)."""
        pooled = torch.einsum("bkq,pbqc->bpkc", self.weights, streams.float())
        return self.read(pooled)

    def read(self, pooled: Tensor) -> Tensor:
        """(B, X, D) pooled reads (B, X, K, C) through the maps: sum_k maps[b, k] @
        pooled[b, x, k] (X: streams, or heads' terms)."""
        if self._shared is not None:
            return pooled.flatten(2) @ self._shared
        return torch.einsum("bxkc,bkdc->bxd", pooled, self.maps)

    def first_rows(self, rows: int) -> LinearHead | None:
        """This head on streams cut to their first ``rows`` tokens (B, rows, C); None where it
        reads a later token."""
        if bool(self.weights[..., rows:].any()):
            return None
        return LinearHead(self.weights[..., :rows], self.maps)

    def through(self, w_o: Tensor) -> Tensor:
        """(B or 1, K, H, D, d) each read's map times each head's slice of an output
        projection ``w_o`` (C, H, d)."""
        return torch.einsum("bkdc,chm->bkhdm", self.maps, w_o)


def first_tokens_head(
    readout: StreamReadout, dims: int, max_bytes: int, notes: dict
) -> LinearHead | None:
    """The frozen head as one read per token it reads (weights one-hot, maps its Jacobian at
    that token), where the family's readout reads a first few tokens (a class token) and runs
    on them alone; None where it does not (``notes["speed"]`` says why)."""
    if readout.readout is None:
        notes["speed"] = "the head is read through the model's forward (no family readout)"
        return None
    stream = readout.stream.detach().float()
    rows = _read_rows(readout, stream)
    count = len(rows)
    held = len(stream) * dims * count * stream.shape[-1] * 4
    if not torch.equal(rows.cpu(), torch.arange(count)) or held > max_bytes:
        notes["speed"] = f"the head reads {count} tokens, not a first few"
        return None
    with torch.no_grad():
        cut = _embedding_of(readout.first_rows(stream[:, :count]))
        whole = _embedding_of(readout(stream, frozen=True))
    if not torch.allclose(cut, whole, rtol=1e-4, atol=1e-5 * float(whole.abs().max())):
        notes["speed"] = "the family's readout does not run on the tokens it reads alone"
        return None
    jacobian = _first_rows_jacobian(readout, stream[:, :count], dims, max_bytes)  # (B, D, R, C)
    weights = torch.zeros(len(stream), count, stream.shape[1], device=stream.device)
    weights[:, torch.arange(count), rows] = 1
    return LinearHead(weights, jacobian.transpose(1, 2))


def _read_rows(readout: StreamReadout, stream: Tensor) -> Tensor:
    """(R,) the token positions the frozen head reads: where the gradient of its embedding
    along a random direction is not zero (a position read with a zero gradient along a random
    direction has probability zero)."""
    probe = stream.clone().requires_grad_(True)
    generator = torch.Generator().manual_seed(0)
    with torch.enable_grad(), frozen_parameters(readout.hm.model):
        embedding = embedding_of(readout(probe, frozen=True)).float()
        direction = torch.randn(embedding.shape, generator=generator).to(embedding.device)
        (gradient,) = torch.autograd.grad(embedding, probe, direction)
    return (gradient.abs().amax((0, 2)) > 0).nonzero()[:, 0]


def _first_rows_jacobian(readout: StreamReadout, cut: Tensor, dims: int, max_bytes: int) -> Tensor:
    """(B, D, R, C) the frozen head's Jacobian on the streams ``cut`` (B, R, C) to the rows it
    reads: the head run once on d copies of them per pass (d as ``max_bytes`` holds), each
    copy's gradient of one embedding dimension."""
    batch = len(cut)
    chunk = max(1, min(dims, max_bytes // (cut.numel() * 4 * 4)))
    jacobian = torch.empty(batch, dims, *cut.shape[1:], device=cut.device)
    with torch.enable_grad(), frozen_parameters(readout.hm.model):
        for start in range(0, dims, chunk):
            count = min(chunk, dims - start)
            copies = cut.repeat(count, 1, 1).requires_grad_(True)
            embedding = embedding_of(readout.first_rows(copies)).float()
            rows = torch.zeros_like(embedding).view(count, batch, dims)
            rows[torch.arange(count), :, start + torch.arange(count)] = 1
            (gradient,) = torch.autograd.grad(embedding, copies, rows.view_as(embedding))
            gradient = gradient.view(count, batch, *cut.shape[1:])
            jacobian[:, start : start + count] = gradient.transpose(0, 1)
    return jacobian


def _embedding_of(output: object) -> Tensor:
    return embedding_of(output).detach().float()
