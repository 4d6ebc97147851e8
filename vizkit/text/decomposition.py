"""A CLIP-family image embedding as a sum of direct contributions: of the stream entering the
first block, of each attention and MLP output, of each head, and of each head through each
source token (Gandelsman, Efros and Steinhardt 2024, "Interpreting CLIP's Image Representation
via Text-Based Decomposition", Sec. 3, Eq. 2-5).

The embedding reads the last block's stream through the head (final norm, pooling, projection),
which is affine once each norm's scale is frozen at its clean value (`StreamReadout`). Its linear
part J (D rows over the stream (N, C)) then maps every part of the stream to its direct
contribution; a head h of block l writes ``sum_j a[h, q, j] u[h, j]`` at query q (u the
source token j's value through the output projection), so token j's contribution is
``sum_q a[h, q, j] <J[:, q], u[h, j]>``, read as the gradient of the block's attention output
with respect to its attention map. Every split is checked to sum to the whole it splits: the
parts and the constant to the embedding, the heads (and the output bias) to each attention
output, each head's tokens to the head.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.residual_stream import (
    StreamReadout,
    check_close,
    head_outputs,
    pattern_name,
    require_full_precision,
    residual_blocks,
    stream_parts,
)
from ..analysis.result import Result
from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import check_count, check_images
from ..hooks.selector import select_layers
from ..models.zero_shot import image_tower
from ..targets import embedding_of
from .pooling import PoolingReadout, pooling_head

__all__ = ["EmbeddingDecomposition", "embedding_decomposition"]

TOLERANCE = 1e-4  # of the largest magnitude of the whole a split must add up to
MAX_BYTES = 256 * 2**20  # the Jacobian rows and map gradients one pass holds


@dataclass(repr=False)
class EmbeddingDecomposition(Result):
    """Each image's embedding split into direct contributions.

    Attributes:
        parts: "embed" (the stream entering the first block), then "<block> attn" and
            "<block> mlp" per block (and "head mlp" for SigLIP's pooling head's MLP).
        contributions: (B, P, D) each part's direct contribution; with ``constant`` they sum to
            ``embedding``.
        constant: (B, D) the head on a zero stream (the final norm's bias through the
            projection).
        embedding: (B, D) the model's image embedding (not normalized).
        blocks: the block paths (L); heads: (B, L, H, D) each head's direct contribution (its
            block's "attn" part less the output bias b_O), None where not asked or the heads do
            not split (``notes["heads"]``).
        token_blocks: the blocks split by source token; tokens: (B, T, H, N, D) head h of token
            block t through source token j (prefix tokens first; summed over j: the head).
        notes: what was left out, and why.
    """

    parts: list[str]
    contributions: Tensor
    constant: Tensor
    embedding: Tensor
    blocks: list[str]
    heads: Tensor | None = None
    token_blocks: list[str] = field(default_factory=list)
    tokens: Tensor | None = None
    notes: dict[str, str] = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def head_shares(self) -> Tensor:
        """(B, L, H, D) each head's contribution over the embedding's norm: along any unit text
        direction, its share of the cosine (what TextSpan and the label shares read)."""
        if self.heads is None:
            raise ValueError(f"This decomposition has no heads: {self.notes.get('heads')}")
        return self.heads / self.embedding.norm(dim=-1)[:, None, None, None]

    def cosine(self, directions: Tensor) -> Tensor:
        """(B, P, K) each part's share of the cosine similarity between the embedding and the
        K ``directions`` (K, D) (text embeddings): <part, t/|t|> / |embedding|; with the
        constant's share they sum to the cosine."""
        return _cosine_shares(self.contributions, self.embedding, directions)

    def token_cosine(self, directions: Tensor, blocks: list[str] | None = None) -> Tensor:
        """(B, K, N) each source token's share of the cosine with each direction (K, D),
        through every head of ``blocks`` (default: all the token blocks)."""
        if self.tokens is None:
            raise ValueError(
                "This decomposition has no per-token split: "
                f"{self.notes.get('tokens', 'ask for it with tokens=')}"
            )
        chosen = self.token_blocks if blocks is None else blocks
        unknown = [b for b in chosen if b not in self.token_blocks]
        if unknown:
            raise ValueError(f"{unknown} were not split by token; these were: {self.token_blocks}.")
        index = [self.token_blocks.index(b) for b in chosen]
        summed = self.tokens[:, index].sum((1, 2))  # (B, N, D)
        return _cosine_shares(summed, self.embedding, directions).transpose(1, 2)


def _cosine_shares(parts: Tensor, embedding: Tensor, directions: Tensor) -> Tensor:
    """(B, P, K): parts (B, P, D) on the unit ``directions`` (K, D), over |embedding| (B, D)."""
    if directions.ndim == 1:
        directions = directions[None]
    if directions.ndim != 2 or directions.shape[-1] != embedding.shape[-1]:
        raise ValueError(
            f"directions must be (K, {embedding.shape[-1]}) text embeddings of the same model; "
            f"got {tuple(directions.shape)}."
        )
    unit = F.normalize(directions.float().to(parts.device), dim=-1)
    return parts @ unit.T / embedding.norm(dim=-1)[:, None, None]


def embedding_decomposition(
    model: nn.Module | HookedModel, x: Tensor, heads: bool = True, tokens=None,
    check_heads: bool = True, max_bytes: int = MAX_BYTES,
) -> EmbeddingDecomposition:  # fmt: skip
    """The direct contribution of each part of the stream, each head and (for the ``tokens``
    blocks) each head through each source token to the image embedding of images x
    (B, C, H, W).

    Args:
        model: a CLIP-family model (open_clip's ``CLIP``, transformers' ``CLIPModel``; its image
            tower is decomposed) or a model that returns image embeddings
            (`vizkit.models.image_tower`, ``CLIPVisionModelWithProjection``).
        heads: split each attention output by head and source token (one forward that records
            the graph from each attention map to its output, and a backward per embedding
            dimension through it).
        tokens: blocks (``layers=`` vocabulary: -1, [-2, -1], a block path) whose source-token
            split is kept in the result; None: none (the heads are their sums).
        check_heads: also split each attention output by editing the heads ((H + 1) forwards
            of the batch per block, where the family allows it) and check the heads against
            it.
        max_bytes: what one pass over the Jacobian's rows holds.

    SigLIP's attention-pooling head is read with its map frozen too; the MLP it adds after the
    pooling is the part "head mlp" (`vizkit.text.pooling`).

    Raises:
        ValueError: a head that is not affine in the stream once its norms are frozen (an
            attention-pooling head vizkit does not know, an MLP head), or a split that does not
            add up.
    """
    if callable(getattr(model, "encode_image", None)) or callable(
        getattr(model, "get_image_features", None)
    ):
        model = image_tower(model)
    return _decompose(model, x, heads, tokens, check_heads, max_bytes)


@analysis_contract
def _decompose(
    hm: HookedModel, x: Tensor, heads: bool, tokens, check_heads: bool, max_bytes: int
) -> EmbeddingDecomposition:
    x = check_images(hm.model, x)
    require_full_precision(x, "Decomposing an embedding")
    max_bytes = check_count("max_bytes", max_bytes)
    parts, labels, _, output = stream_parts(hm, x)
    embedding = _embedding(output)
    blocks = residual_blocks(hm)
    token_blocks = [] if tokens is None else select_layers(
        tokens, blocks, arg="tokens", what="blocks")  # fmt: skip
    if token_blocks and not heads:
        raise ValueError("tokens= splits the heads by source token, so it needs heads=True.")
    if pooling_head(hm.model) is None:
        readout, remainder = StreamReadout(hm, x, blocks), None
    else:  # the head MLP's term is a part of its own
        readout = PoolingReadout(hm, x, blocks, embedding)
        remainder = readout.remainder
        parts, labels = torch.cat([parts, torch.zeros_like(parts[:1])]), [*labels, "head mlp"]
    constant = _frozen(readout, torch.zeros_like(readout.stream))
    pooled = embedding if remainder is None else embedding - remainder
    check_close("The frozen head at the clean stream", _frozen(readout, readout.stream), pooled,
                "the model's", "a norm after the blocks vizkit cannot freeze")  # fmt: skip
    maps = _attention_graphs(hm, x, blocks) if heads else None
    keep = [blocks.index(b) for b in token_blocks]
    contributions = torch.zeros(len(x), len(parts), embedding.shape[-1])
    by_token = []
    for dims, jacobian in _jacobian_rows(readout, embedding.shape[-1], max_bytes):
        read = (jacobian.abs().amax((0, 1, 3)) > 0).nonzero()[:, 0]  # the positions read
        contributions[..., dims] = torch.einsum(
            "pbnc,dbnc->bpd", parts[:, :, read], jacobian[:, :, read]
        ).cpu()  # fmt: skip
        if maps is not None:
            by_token.append(_token_rows(maps, jacobian, read, max_bytes))  # (B, L, H, N, d)
    if remainder is not None:
        contributions[:, -1] = remainder.cpu()
    check_close("The parts' contributions plus the constant",
                contributions.sum(1) + constant.cpu(), embedding.cpu(), "the embedding",
                "the head is not affine in the stream once its norms are frozen (an "
                "attention-pooling head vizkit does not know, an MLP head)")  # fmt: skip
    result = EmbeddingDecomposition(
        labels, contributions, constant.cpu(), embedding.cpu(), blocks,
        options={"heads": heads, "tokens": token_blocks, "width": readout.stream.shape[-1]},
        layout=hm.token_layout(tuple(x.shape[-2:])), image_size=tuple(x.shape[-2:]),
    )  # fmt: skip
    if maps is not None:
        split = torch.cat(by_token, -1)
        result.heads = split.sum(3)
        if token_blocks:
            result.token_blocks, result.tokens = token_blocks, split[:, keep]
        if check_heads:
            _check_heads(hm, x, blocks, parts, readout, result)
    return result


def _embedding(output: object) -> Tensor:
    embedding = embedding_of(output)
    if embedding.ndim != 2:
        raise ValueError(
            f"The model returned {tuple(embedding.shape)}, not one embedding (B, D) per image: "
            "pass a CLIP-family model or its image tower (vk.models.image_tower(model))."
        )
    return embedding.detach().float()


def _frozen(readout: StreamReadout, stream: Tensor) -> Tensor:
    with torch.no_grad():
        return _embedding(readout(stream, frozen=True))


def _jacobian_rows(readout: StreamReadout, dims: int, max_bytes: int):
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


def _attention_graphs(hm: HookedModel, x: Tensor, blocks: list[str]) -> dict:
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


def _check_heads(
    hm: HookedModel, x: Tensor, blocks: list[str], parts: Tensor, readout: StreamReadout,
    result: EmbeddingDecomposition,
) -> None:  # fmt: skip
    """The heads read off the maps against the heads split by editing them (where the family
    allows that edit; ``notes["heads"]`` says where it does not).

    Raises:
        ValueError: the two differ."""
    try:
        attention = [parts[i] for i, p in enumerate(result.parts) if p.endswith(" attn")]
        split = torch.stack(head_outputs(hm, x, blocks, attention))  # (L, H+1, B, N, C)
    except ValueError:
        result.notes["heads"] = "read off the maps; no edited split to check (map not editable)"
        return
    edited = torch.stack([_frozen(readout, s) for s in split[:, :-1].flatten(0, 1)])
    edited = (edited - result.constant.to(edited.device)).unflatten(0, result.heads.shape[1:3])
    check_close("The heads read off the attention maps", result.heads,
                edited.permute(2, 0, 1, 3).cpu(), "the heads split by editing them",
                "the map handed on is not the one the output was computed from")  # fmt: skip
