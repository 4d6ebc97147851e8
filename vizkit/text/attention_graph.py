"""The heads' direct contributions read through the recorded graph from each attention map to
its block's attention output: the decomposition's path for attention modules
`vizkit.text.head_values` does not read (and the tests' oracle for the path that does). The
frozen head's Jacobian rows J_d (B, N, C) are taken a pass of rows at a time; head h of block l
through source token j contributes ``sum_q a[h, q, j] <J_d[q], u[h, j]>``, read as the gradient
of <J_d, attention output> with respect to the map (Gandelsman et al. 2024, Eq. 5)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..analysis.residual_stream import StreamReadout, pattern_name
from ..hooks import HookedModel
from ..hooks.gradient_graph import frozen_parameters
from ..targets import embedding_of

__all__ = ["graph_split", "jacobian_rows"]


def graph_split(
    hm: HookedModel, x: Tensor, blocks: list[str], readout: StreamReadout, parts: Tensor,
    dims: int, heads: bool, max_bytes: int,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """(B, P, D) the parts' (P, B, N, C) contributions and, with ``heads``, (B, L, H, N, D)
    each head of each block through each source token."""
    maps = attention_graphs(hm, x, blocks) if heads else None
    contributions = torch.zeros(len(x), len(parts), dims)
    by_token = []
    for chosen, jacobian in jacobian_rows(readout, dims, max_bytes):
        read = (jacobian.abs().amax((0, 1, 3)) > 0).nonzero()[:, 0]  # the positions read
        contributions[..., chosen] = torch.einsum(
            "pbnc,dbnc->bpd", parts[:, :, read], jacobian[:, :, read]
        ).cpu()  # fmt: skip
        if maps is not None:
            by_token.append(_token_rows(maps, jacobian, read, max_bytes))  # (B, L, H, N, d)
    return contributions, None if maps is None else torch.cat(by_token, -1)


def jacobian_rows(readout: StreamReadout, dims: int, max_bytes: int):
    """Yields (slice of embedding dimensions, their Jacobian rows (d, B, N, C)) of the frozen
    head at the clean stream, as many rows per pass as ``max_bytes`` holds."""
    stream = readout.stream.detach().float().clone().requires_grad_(True)
    chunk = max(1, min(dims, max_bytes // (stream.numel() * 4 * 3)))
    with torch.enable_grad(), frozen_parameters(readout.hm.model):
        embedding = embedding_of(readout(stream, frozen=True)).float()
        eye = torch.eye(dims, device=stream.device)
        for start in range(0, dims, chunk):
            rows = eye[start : start + chunk, None].expand(-1, len(stream), -1)
            (jacobian,) = torch.autograd.grad(
                embedding, stream, rows, retain_graph=True, is_grads_batched=True
            )
            yield slice(start, start + len(rows)), jacobian


def attention_graphs(hm: HookedModel, x: Tensor, blocks: list[str]) -> dict:
    """Per block: its attention map (B, H, N, N) and attention output (B, N, C) from one forward
    that records the graph between them (parameters frozen).

    Raises:
        ValueError: a block without one attention map, or whose output was not computed from
            the map the family hands on (a map computed beside a fused kernel)."""
    names = {}
    for block in blocks:
        pattern = pattern_name(hm, block)
        if pattern is None:
            raise ValueError(
                f"{block} has no single attention map (hook_pattern), so its attention output "
                "does not split by head; pass heads=False."
            )
        names[block] = (pattern, f"{block}.hook_attn_out")
    kept: dict[str, Tensor] = {}

    def keep(t: Tensor, *, name: str) -> None:
        kept[name] = t

    fwd = {name: keep for pair in names.values() for name in pair}
    images = x.detach().clone().requires_grad_(True)
    with torch.enable_grad(), frozen_parameters(hm.model), hm.hooks(fwd=fwd):
        hm.model(images)
    graphs = {}
    for block, (pattern, out) in names.items():
        source = kept[pattern] if kept[pattern]._base is None else kept[pattern]._base
        if not _computed_from(kept[out], source):
            raise ValueError(
                f"{block}'s attention output was not computed from the map {pattern} hands on "
                "(it is computed beside the attention's kernel), so its heads cannot be read "
                "off the map; pass heads=False."
            )
        graphs[block] = {"map": kept[pattern], "source": source, "out": kept[out]}
    return graphs


def _computed_from(output: Tensor, source: Tensor) -> bool:
    """Whether ``source`` is on the autograd graph of ``output``."""
    if not (output.requires_grad and source.requires_grad):
        return False
    (gradient,) = torch.autograd.grad(output, source, torch.ones_like(output),
                                      retain_graph=True, allow_unused=True)  # fmt: skip
    return gradient is not None


def _token_rows(maps: dict, jacobian: Tensor, read: Tensor, max_bytes: int) -> Tensor:
    """(B, L, H, N, d): sum_q a[h, q, j] <J_d[q], u[h, j]> per block, from the gradient of
    <J_d, attention output> with respect to the map (taken at the tensor the output was
    computed from: a map returned as a view of it hands its gradient to that base).

    Row q of that gradient depends on row q of J_d only, so where the head reads one position
    r (a class token) the rows of up to N dimensions d share one backward: J_d[r] put at row i
    gives <J_d[r], u[h, j]> in row i."""
    rows = []
    for entry in maps.values():
        if len(read) == 1:
            rows.append(_one_position_rows(entry, jacobian, int(read[0])))
        else:
            rows.append(_many_position_rows(entry, jacobian, read, max_bytes))
    return torch.stack(rows, 1)


def _many_position_rows(entry: dict, jacobian: Tensor, read: Tensor, max_bytes: int) -> Tensor:
    """(B, H, N, d) for a head that reads several positions: one backward per dimension,
    batched as ``max_bytes`` allows."""
    pattern = entry["map"].detach()
    chunk = max(1, max_bytes // (pattern.numel() * 4 * 3))
    rows = []
    for start in range(0, len(jacobian), chunk):
        (gradient,) = torch.autograd.grad(
            entry["out"], entry["source"], jacobian[start : start + chunk].to(entry["out"].dtype),
            retain_graph=True, is_grads_batched=True,
        )  # fmt: skip
        gradient = gradient.reshape(-1, *pattern.shape)  # (d, B, H, Nq, Nk)
        rows.append(torch.einsum("bhqk,dbhqk->bhkd", pattern[:, :, read],
                                 gradient[:, :, :, read]).cpu())  # fmt: skip
    return torch.cat(rows, -1)


def _one_position_rows(entry: dict, jacobian: Tensor, position: int) -> Tensor:
    """(B, H, N, d) for a head that reads only ``position``, N dimensions per backward."""
    out, pattern = entry["out"], entry["map"].detach()
    tokens = out.shape[1]
    rows = []
    for start in range(0, len(jacobian), tokens):
        group = jacobian[start : start + tokens, :, position]  # (k, B, C)
        packed = torch.zeros_like(out)
        packed[:, : len(group)] = group.transpose(0, 1).to(out.dtype)
        (gradient,) = torch.autograd.grad(out, entry["source"], packed, retain_graph=True)
        gradient = gradient.reshape(pattern.shape)[:, :, : len(group)]  # (B, H, k, N)
        rows.append((pattern[:, :, position, None] * gradient).transpose(2, 3))
    return torch.cat(rows, -1).cpu()
