"""A CLIP-family image embedding as a sum of direct contributions: of the stream entering the
first block, of each attention and MLP output, of each head, and of each head through each
source token (Gandelsman, Efros and Steinhardt 2024, "Interpreting CLIP's Image Representation
via Text-Based Decomposition", Sec. 3, Eq. 2-5).

The embedding reads the last block's stream through the head (final norm, pooling, projection),
which is affine once each norm's scale is frozen at its clean value: a `LinearHead`, K pooled
reads of the stream each through a (D, C) map (one read of the class token for CLIP, one per
pooling head for SigLIP). A head h of block l writes W_O^h z_h with z_h[q] = sum_j a[h, q, j]
v_h[j], so its direct term is the head's pooled read of W_O^h z_h and source token j's is
sum_k (sum_q w_kq a[h, q, j]) M_k W_O^h v_h[j] (Eq. 5): one forward that keeps each block's map
and values, then matrix products. Every split is checked to sum to the whole it splits: the
parts and the constant to the embedding, each block's heads (and the output bias) to its
attention output, each head's tokens to the head.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.linear_head import LinearHead, first_tokens_head
from ..analysis.residual_stream import (
    StreamReadout,
    StreamRun,
    check_close,
    head_outputs,
    pattern_name,
    require_full_precision,
    residual_blocks,
    stream_run,
)
from ..analysis.result import Result
from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count, check_images
from ..hooks.selector import select_layers
from ..models.zero_shot import image_tower
from ..targets import embedding_of
from .attention_graph import graph_split
from .head_values import HeadValues, reading_values
from .pooling import PoolingReadout, pooled_output, pooling_head

__all__ = ["EmbeddingDecomposition", "embedding_decomposition", "image_bytes"]

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
    check_heads: bool = False, max_bytes: int = MAX_BYTES,
) -> EmbeddingDecomposition:  # fmt: skip
    """The direct contribution of each part of the stream, each head and (for the ``tokens``
    blocks) each head through each source token to the image embedding of images x
    (B, C, H, W), from one forward of x.

    Args:
        model: a CLIP-family model (open_clip's ``CLIP``, transformers' ``CLIPModel``; its image
            tower is decomposed) or a model that returns image embeddings
            (`vizkit.models.image_tower`, ``CLIPVisionModelWithProjection``).
        heads: split each attention output by head (and source token): read off each block's
            map and values in the forward (`vizkit.text.head_values`), each block's heads
            checked against its attention output as the head reads it. Attention modules
            vizkit does not read that way are split through the recorded graph from each map
            to its output (`vizkit.text.attention_graph`, slower; ``notes["speed"]`` says
            why).
        tokens: blocks (``layers=`` vocabulary: -1, [-2, -1], a block path) whose source-token
            split is kept in the result; None: none (the heads are their sums).
        check_heads: also split each attention output by editing the heads ((H + 1) forwards
            of the batch per block, where the family allows it) and check the heads against
            it: an independent check, as the tests run it.
        max_bytes: what one pass over the head's Jacobian holds.

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
    blocks = residual_blocks(hm)
    token_blocks = [] if tokens is None else select_layers(
        tokens, blocks, arg="tokens", what="blocks")  # fmt: skip
    if token_blocks and not heads:
        raise ValueError("tokens= splits the heads by source token, so it needs heads=True.")
    keep = [blocks.index(b) for b in token_blocks]
    rows = None if check_heads else rows_hint(hm, tuple(x.shape[-2:]))
    read = _read(hm, x, blocks, heads, keep, max_bytes, rows)
    if read is None:  # the head reads past the rows kept, or through the graph: every row
        read = _read(hm, x, blocks, heads, keep, max_bytes, None)
    result = EmbeddingDecomposition(
        read.labels, read.contributions, read.constant, read.embedding, blocks,
        notes=read.notes, layout=hm.token_layout(tuple(x.shape[-2:])),
        options={"heads": heads, "tokens": token_blocks, "width": read.width,
                 "sequence": read.sequence, "rows": read.rows},
        image_size=tuple(x.shape[-2:]),
    )  # fmt: skip
    if read.split is not None:
        result.heads = read.split[0]
        if token_blocks:
            result.token_blocks, result.tokens = token_blocks, read.split[1]
        if check_heads:
            _check_heads(hm, x, blocks, read.parts, read.readout, result)
    return result


def image_bytes(result: EmbeddingDecomposition) -> int:
    """The bytes one image's decomposition holds at once, from its layout (blocks L, heads H,
    tokens N, rows R kept of each part and map, width C, embedding D, token blocks T): the
    maps (L, H, R, N), values (L, N, C), parts (2L + 2, R, C) and final stream (N, C) of the
    clean run, one block's map and MLP in the forward (H N N + 4 N C), the head's Jacobian
    (D, R, C) where it reads R < N rows, and the result with its token terms ((2L + 1 + L H) D
    + (T + 2) H N D where T > 0); float32.
    """
    blocks, dims, width = len(result.blocks), result.embedding.shape[-1], result.options["width"]
    tokens, rows = result.options["sequence"], result.options["rows"]
    heads = 0 if result.heads is None else result.heads.shape[2]
    run = blocks * heads * rows * tokens + blocks * tokens * width
    run += (2 * blocks + 2) * rows * width + tokens * width
    forward = heads * tokens * tokens + 4 * tokens * width
    jacobian = dims * rows * width if rows < tokens else 0  # a pooling head's maps: shared
    held = jacobian + (2 * blocks + 1 + blocks * heads) * dims
    if result.token_blocks:  # the token terms, and two blocks' worth while they are made
        held += (len(result.token_blocks) + 2) * heads * tokens * dims
    return 4 * (run + forward + held)


def rows_hint(hm: HookedModel, image_size: tuple[int, int]) -> int | None:
    """The first tokens the head is expected to read alone: the prefix tokens, where the
    family's readout reads a class token and no pooling head reads the stream; None: every
    token (SigLIP's pooling weights depend on the whole final stream). A hint only: `_read`
    checks it against the head it finds."""
    if hm.family.readout is None or pooling_head(hm.model) is not None:
        return None
    layout = hm.token_layout(image_size)
    return layout.num_prefix_tokens if layout is not None and layout.class_token else None


@dataclass
class _Read:
    """The decomposition of one clean run: the part ``labels``, ``contributions`` (B, P, D),
    ``constant`` and ``embedding`` (B, D), the heads' ``split`` (`_direct_heads`), the
    ``parts`` and ``readout`` (for `_check_heads`), the stream's ``width`` and tokens
    (``sequence``), the ``rows`` of each part and map kept, and ``notes``."""

    labels: list[str]
    contributions: Tensor
    constant: Tensor
    embedding: Tensor
    split: tuple[Tensor, Tensor | None] | None
    parts: Tensor
    readout: StreamReadout
    width: int
    sequence: int
    rows: int
    notes: dict[str, str]


def _read(
    hm: HookedModel, x: Tensor, blocks: list[str], heads: bool, keep: list[int],
    max_bytes: int, rows: int | None,
) -> _Read | None:  # fmt: skip
    """The decomposition from one clean run keeping the first ``rows`` tokens of each part
    and map (None: all); None where the head reads a later token or the heads need the
    graph, which needs them all."""
    run = _clean_run(hm, x, blocks, heads, rows)
    parts, labels = run.stream.parts, run.stream.labels
    embedding = _embedding(run.stream.output)
    if run.pooled is None:
        readout, remainder = run.stream.readout(hm, x, blocks), None
    else:  # the head MLP's term is a part of its own
        readout = PoolingReadout(hm, x, blocks, embedding, (run.stream.final, run.pooled))
        remainder = readout.remainder
        parts, labels = torch.cat([parts, torch.zeros_like(parts[:1])]), [*labels, "head mlp"]
    constant = _frozen(readout, torch.zeros_like(readout.stream))
    pooled = embedding if remainder is None else embedding - remainder
    check_close("The frozen head at the clean stream", _frozen(readout, readout.stream), pooled,
                "the model's", "a norm after the blocks vizkit cannot freeze")  # fmt: skip
    dims = embedding.shape[-1]
    notes: dict[str, str] = {}
    if remainder is None:
        head = first_tokens_head(readout, dims, max_bytes, notes)
    else:
        head = readout.linear_head()
    if rows is not None:
        head = None if head is None else head.first_rows(rows)
        if head is None:
            return None
    split = None
    if head is not None and heads:
        split = _direct_heads(run, blocks, keep, head, notes)
    if head is not None and (split is not None or not heads):
        contributions = head(parts).cpu()
    elif rows is not None:
        return None
    else:
        contributions, by_token = graph_split(hm, x, blocks, readout, parts, dims, heads,
                                              max_bytes)  # fmt: skip
        split = None if by_token is None else (by_token.sum(3), by_token[:, keep])
    if remainder is not None:
        contributions[:, -1] = remainder.cpu()
    check_close("The parts' contributions plus the constant",
                contributions.sum(1) + constant.cpu(), embedding.cpu(), "the embedding",
                "the head is not affine in the stream once its norms are frozen (an "
                "attention-pooling head vizkit does not know, an MLP head)")  # fmt: skip
    sequence, width = readout.stream.shape[1:]
    return _Read(labels, contributions, constant.cpu(), embedding.cpu(), split, parts, readout,
                 width, sequence, parts.shape[2], notes)  # fmt: skip


@dataclass
class _CleanRun:
    """What the one clean forward read: the stream (`stream_run`), each block's map and
    `HeadValues` (where read), and SigLIP's pooled z (B, D) (None without a pooling head)."""

    stream: StreamRun
    maps: dict[str, Tensor]
    values: dict[str, HeadValues]
    pooled: Tensor | None


def _clean_run(
    hm: HookedModel, x: Tensor, blocks: list[str], heads: bool, rows: int | None
) -> _CleanRun:
    """The clean forward, the parts and maps cut to their first ``rows`` tokens (None: all)."""
    patterns = {b: _pattern(hm, b) for b in blocks} if heads else {}
    attention = {b: p.removesuffix(".hook_pattern") for b, p in patterns.items()}
    pooling = pooling_head(hm.model) is not None
    with (reading_values(hm.model, attention) as values,
          pooled_output(hm.model) if pooling else nullcontext({}) as pooled):  # fmt: skip
        stream = stream_run(hm, x, blocks, list(patterns.values()), rows)
    maps = {b: stream.acts[p] for b, p in patterns.items()}
    return _CleanRun(stream, maps, dict(values), pooled["z"] if pooling else None)


def _pattern(hm: HookedModel, block: str) -> str:
    pattern = pattern_name(hm, block)
    if pattern is None:
        raise ValueError(
            f"{block} has no single attention map (hook_pattern), so its attention output "
            "does not split by head; pass heads=False."
        )
    return pattern


def _direct_heads(
    run: _CleanRun, blocks: list[str], keep: list[int], head: LinearHead, notes: dict
) -> tuple[Tensor, Tensor | None] | None:
    """(heads (B, L, H, D), tokens (B, T, H, N, D) of the ``keep`` blocks) from the clean run's
    maps and values, each block's heads checked against its attention output as the head
    reads it; None where a block was not read or its check fails (``notes["speed"]``)."""
    missing = [b for b in blocks if b not in run.values]
    if missing:
        notes["speed"] = f"{missing[0]}'s attention is read through its graph (no value reader)"
        return None
    heads, tokens = [], []
    for i, block in enumerate(blocks):
        values, pattern = run.values[block], run.maps[block]
        pooled, mixing = values.pooled_terms(pattern, head.weights)
        error = values.check(pooled, run.stream.acts[f"{block}.hook_attn_out"], head.weights)
        if not error <= TOLERANCE:
            notes["speed"] = (f"{block}'s heads read off its values differ from its attention "
                              f"output by {error:.1e}; read through its graph")  # fmt: skip
            return None
        heads.append(head.read(pooled))
        if i in keep:
            tokens.append(values.token_terms(mixing, head))
    return torch.stack(heads, 1).cpu(), (torch.stack(tokens, 1).cpu() if tokens else None)


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
