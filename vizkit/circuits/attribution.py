"""Attribution patching: the first-order effect on a score of patching each node, and each edge,
from a clean run to a corrupted one, from one backward of the clean run.

A node u's effect is (a_u(corrupted) - a_u(clean)) . dM/da_u at the clean run (Nanda 2023,
"Attribution Patching"); an edge's, from node u to the input of a downstream node d, is
(a_u(corrupted) - a_u(clean)) . dM/d(input of d) (Syed, Rager and Conmy 2023, "Attribution
Patching Outperforms Automated Circuit Discovery", Eq. 2), the input of d being the stream it
reads, of which u's output is one term. EAP-IG (Hanna, Pezzelle and Belinkov 2024, "Have Faith
in Faithfulness", Sec. 3) averages the gradients over m runs whose embedded tokens go from the
corrupted to the clean ones, z' + k/m (z - z'), k = 1..m; EAP is its m = 1.

The gradients are read through vizkit's hooks on the user's model as it is: the stream entering
each block, each branch's output, and each head's slice of the output projection's input. The
gradient at a downstream input is the backward of its branch alone (its output's gradient
pulled back to the stream it read), and a node's gradient is checked to be the sum of the
gradients at the inputs it feeds, which holds exactly where the stream is a sum of the blocks'
outputs; a model where it does not is refused. Optionally the attention input is split further
into each head's query, key and value inputs (`vizkit.circuits.qkv`): the gradient at the
tensors that hold them, one head's slice of one of them at a time, pulled back to the stream
entering the block; their sum is checked to be the attention input's gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.component_edits import RunScore
from ..analysis.residual_stream import check_close, require_full_precision, residual_blocks
from ..analysis.result import Result
from ..head_outputs import head_inputs, projection_maps
from ..hooks import HookedModel, Target, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import check_choice, check_count, check_image_pairs
from .corruptions import warn_if_unchanged
from .graph import ComponentGraph
from .points import Points, point_names, read_points
from .qkv import QKVReader, qkv_readers

__all__ = ["ATTRIBUTIONS", "AttributionResult", "attribution_patching", "eap_steps"]

ATTRIBUTIONS = ("eap", "eap-ig")


@dataclass(repr=False)
class AttributionResult(Result):
    """First-order effects on the score of patching corrupted activations into the clean run.

    Attributes:
        upstream, downstream: the graph's node and input names (`ComponentGraph`).
        nodes: (B, U) each node's effect, patched everywhere it is read.
        edges: (B, U, D) the effect of patching node u's output into input d alone; NaN where
            u does not feed d. A node's effect is the sum of its edges'.
        resid: (B, L, N) the effect of patching the stream entering each block at one token
            (None from `exact_patching`).
        tokens: (B, U, N) each node's effect at each token, summing to ``nodes`` (None from
            `exact_patching`).
        qkv: (B, U, L, 3, H) the effect of patching node u's output into the query (0), key (1)
            or value (2) input of head h of block l alone; NaN where u does not write before
            block l reads. Its sum over (3, H) is the edge into block l's attention input.
            None unless asked for (``qkv=True`` of `attribution_patching`).
        clean_score, corrupted_score: (B,) the score on each input.
        targets, versus: (B,) the classes of the score (``targets`` logit less ``versus``);
            None for a score target (`vizkit.targets`).
    """

    upstream: list[str]
    downstream: list[str]
    nodes: Tensor
    edges: Tensor
    resid: Tensor | None
    clean_score: Tensor
    corrupted_score: Tensor
    targets: Tensor | None
    versus: Tensor | None
    tokens: Tensor | None = None
    qkv: Tensor | None = None
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def node(self, name: str) -> Tensor:
        """(B,) the effect of the node ``name`` (one of ``upstream``)."""
        return self.nodes[:, self.upstream.index(check_choice("node", name, self.upstream))]


@analysis_contract
def attribution_patching(
    model: nn.Module | HookedModel,
    clean: Tensor,
    corrupted: Tensor,
    target: Target = None,
    versus: Target = None,
    method: str = "eap",
    steps: int = 5,
    heads: bool = True,
    qkv: bool = False,
    progress: bool = True,
) -> AttributionResult:
    """Node and edge effects of patching ``corrupted`` activations into the ``clean`` run.

    Args:
        clean, corrupted: (B, C, H, W) pairs of images.
        target: the class scored, default the clean prediction; versus: a class whose logit is
            subtracted (a logit difference). Or a score target (`vizkit.targets`), e.g. a
            backbone's ``embedding_norm()``.
        method: "eap" (the gradient at the clean run) or "eap-ig" (averaged over ``steps``
            runs from the corrupted to the clean embedded tokens).
        heads: one node per attention head (its output before the output projection, read
            at the projection's input, or for torch's MultiheadAttention from its weights and
            values: `vizkit.head_outputs`); False: each block's attention as one node.
        qkv: also the edges into each head's query, key and value input (``qkv`` of the
            result; timm's and transformers' attention, `vizkit.circuits.qkv`): 3 H more
            vector-Jacobian products per block and gradient run.
        progress: a progress bar over EAP-IG's steps.

    Returns:
        `AttributionResult`; its effects estimate patched score less clean score.
    """
    clean, corrupted = check_image_pairs(model.model, clean, corrupted)
    steps = eap_steps(method, steps)
    require_full_precision(clean, "Attribution patching")
    blocks = residual_blocks(model)
    readers = qkv_readers(model, blocks) if qkv else None
    found = head_inputs(model, clean, blocks) if heads else None
    graph = ComponentGraph(tuple(blocks), None if found is None else found.heads)
    clean_points, clean_out = read_points(model, clean, blocks, found)
    corrupted_points, corrupted_out = read_points(model, corrupted, blocks, found)
    score = RunScore.of(clean_out, target, versus)
    rows = torch.arange(len(clean), device=clean.device)
    high, low = score(clean_out, rows), score(corrupted_out, rows)
    warn_if_unchanged(clean_out, score, high, low)
    diff = corrupted_points.minus(clean_points)
    if found is not None:  # each head's difference as written to the stream, (B, N, H, C)
        maps = projection_maps(model, clean, found, clean_points.z, clean_points.attn)
        diff.z = [m.each_head(z, h) for m, z, h in zip(maps, diff.z, found.heads, strict=True)]
    start, end = corrupted_points.resid[0], clean_points.resid[0]
    total = None
    for k in tqdm(range(1, steps + 1), desc=method, disable=not progress or steps == 1,
                  leave=False):  # fmt: skip
        embedded = start + (end - start) * (k / steps)
        effects = _effects(model, clean, embedded, diff, graph, lambda o: score(o, rows), readers)
        total = effects if total is None else [t + e for t, e in zip(total, effects, strict=True)]
    nodes, edges, resid, tokens, *by_qkv = (t / steps for t in total)
    return AttributionResult(
        graph.upstream, graph.downstream, nodes, edges, resid, high, low, score.targets,
        score.versus, tokens, by_qkv[0] if by_qkv else None,
        options={"method": method, "steps": steps, "heads": heads},
        layout=model.token_layout(tuple(clean.shape[-2:])), image_size=tuple(clean.shape[-2:]),
    )  # fmt: skip


def eap_steps(method: str, steps: int) -> int:
    """The gradient runs ``method`` ("eap" or "eap-ig") averages: 1, or ``steps``."""
    check_choice("method", method, ATTRIBUTIONS)
    return 1 if method == "eap" else check_count("steps", steps)


def _effects(
    hm: HookedModel, x: Tensor, embedded: Tensor, diff: Points, graph: ComponentGraph,
    score: Callable[[object], Tensor], readers: list[QKVReader] | None,
) -> list[Tensor]:  # fmt: skip
    """One forward of x with the stream entering the first block set to ``embedded`` (B, N, C)
    and one backward of ``score``: [nodes (B, U), edges (B, U, D), resid (B, L, N), tokens
    (B, U, N)], and with ``readers`` qkv (B, U, L, 3, H), the differences ``diff`` (its ``z``:
    each head's, as written to the stream) times the gradients."""
    names = point_names(list(graph.blocks))
    kept: dict[str, Tensor] = {}
    leaf = embedded.detach().clone().requires_grad_(True)

    def keep(t: Tensor, *, name: str) -> Tensor:
        kept[name] = leaf if name == names["resid"][0] else t.view_as(t)
        return kept[name]

    last = f"{graph.blocks[-1]}.hook_resid_post"
    wanted = [*names["resid"], *names["mid"], *names["attn"], *names["mlp"], last]
    held = [] if readers is None else [n for reader in readers for n in reader.names]
    with torch.enable_grad(), frozen_parameters(hm.model):
        with hm.hooks(fwd=dict.fromkeys([*wanted, *held], keep)):
            value = score(hm.model(x))
        return _backward(value, kept, names, last, diff, graph, readers)


def _backward(
    value: Tensor, kept: dict[str, Tensor], names: dict[str, list[str]], last: str,
    diff: Points, graph: ComponentGraph, readers: list[QKVReader] | None,
) -> list[Tensor]:  # fmt: skip
    """The effects from the score ``value`` (B,) of a run whose activations are ``kept``."""
    resid, mid = [kept[n] for n in names["resid"]], [kept[n] for n in names["mid"]]
    attn, mlp = [kept[n] for n in names["attn"]], [kept[n] for n in names["mlp"]]
    held = [] if readers is None else [[kept[n] for n in reader.names] for reader in readers]
    qkv = [tensor for tensors in held for tensor in tensors]
    grads = torch.autograd.grad(value.sum(), [*resid, *attn, *mlp, kept[last], *qkv],
                                retain_graph=True)  # fmt: skip
    layers = len(resid)
    g_resid, g_attn = grads[:layers], grads[layers : 2 * layers]
    g_mlp, g_final = grads[2 * layers : 3 * layers], grads[3 * layers]
    inputs = []  # the gradient at each downstream input: its branch's backward alone
    for layer in range(layers):
        inputs.append(_pullback(attn[layer], resid[layer], g_attn[layer]))
        inputs.append(_pullback(mlp[layer], mid[layer], g_mlp[layer]))
    inputs = torch.stack([*inputs, g_final])  # (D, B, N, C)
    after = inputs.flip(0).cumsum(0).flip(0)  # after[k]: the sum over inputs k, k + 1, ...
    _check_sums(after, g_resid, g_attn, g_mlp)
    edges, tokens = _node_and_edge_effects(diff, graph, inputs, after)
    resid_effects = torch.stack([(d * g).sum(-1) for d, g in zip(diff.resid, g_resid, strict=True)],
                                1)  # fmt: skip
    effects = [edges.nansum(-1), edges, resid_effects, tokens]
    if readers is not None:
        g_held = _grouped(grads[3 * layers + 1 :], [len(tensors) for tensors in held])
        effects.append(_qkv_edges(readers, held, g_held, resid, inputs, diff, graph))
    return effects


def _pullback(output: Tensor, source: Tensor, gradient: Tensor) -> Tensor:
    """The gradient ``gradient`` at ``output`` pulled back to ``source`` (a vector-Jacobian
    product), zero where the output does not depend on it."""
    (pulled,) = torch.autograd.grad(output, source, gradient, retain_graph=True,
                                    allow_unused=True)  # fmt: skip
    return torch.zeros_like(source) if pulled is None else pulled


def _check_sums(
    after: Tensor, g_resid: tuple[Tensor, ...], g_attn: tuple[Tensor, ...],
    g_mlp: tuple[Tensor, ...],
) -> None:  # fmt: skip
    """A node's gradient is the sum of the gradients at the inputs that read it (the stream is
    a sum of the blocks' outputs; ``after`` (D, B, N, C): the sums of the gradients at the
    inputs from each on): refuse the model where it is not."""
    for layer in range(len(g_resid)):
        for gradient, first in ((g_resid[layer], 2 * layer), (g_attn[layer], 2 * layer + 1),
                                (g_mlp[layer], 2 * layer + 2)):  # fmt: skip
            check_close("A node's gradient", after[first], gradient,
                         "the sum of the gradients at the inputs it feeds",
                         "the stream is not the sum of the blocks' attention and MLP outputs "
                         "(a post-norm or gated block), so its edges are not defined")  # fmt: skip


def _node_and_edge_effects(
    diff: Points, graph: ComponentGraph, inputs: Tensor, after: Tensor
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """edges (B, U, D) and tokens (B, U, N): each node's difference times the gradient at
    each input it feeds (NaN where it feeds none), and times the sum of those gradients at
    each token; a node's effect is the sum of its edges' (its gradient is the sum of theirs,
    `_check_sums`)."""
    batch, count = inputs.shape[1], len(graph.downstream)
    edges = inputs.new_full((batch, len(graph.upstream), count), torch.nan)
    tokens = inputs.new_zeros(batch, len(graph.upstream), inputs.shape[2])
    row = 0

    def write(delta: Tensor, first: int) -> None:  # (B, N, C), or (B, N, H, C) for H heads
        nonlocal row
        heads = 1 if delta.ndim == 3 else delta.shape[2]
        per_head = delta[:, :, None] if delta.ndim == 3 else delta
        edges[:, row : row + heads, first:] = torch.einsum("bnhc,dbnc->bhd", per_head,
                                                           inputs[first:])  # fmt: skip
        tokens[:, row : row + heads] = torch.einsum("bnhc,bnc->bhn", per_head, after[first])
        row += heads

    write(diff.resid[0], 0)
    for layer in range(len(graph.blocks)):
        write(diff.attn[layer] if diff.z is None else diff.z[layer], 2 * layer + 1)
        write(diff.mlp[layer], 2 * layer + 2)
    return edges, tokens


def _grouped(items: tuple[Tensor, ...], sizes: list[int]) -> list[tuple[Tensor, ...]]:
    """``items`` cut into consecutive groups of ``sizes``."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [items[start : start + size] for start, size in zip(starts, sizes, strict=True)]


def _qkv_edges(
    readers: list[QKVReader], held: list[list[Tensor]], gradients: list[tuple[Tensor, ...]],
    resid: list[Tensor], inputs: Tensor, diff: Points, graph: ComponentGraph,
) -> Tensor:  # fmt: skip
    """(B, U, L, 3, H) each node's difference times the gradient at the stream entering block
    l as read by head h's query, key or value (NaN where the node writes after block l reads);
    per block, the tensors ``held`` that hold them and the score's ``gradients`` at those."""
    groups = _stream_writes(diff)
    shape = (len(inputs[0]), len(graph.upstream), len(readers), 3, readers[0].heads)
    qkv = inputs.new_full(shape, torch.nan)
    for layer, (reader, tensors, grads) in enumerate(zip(readers, held, gradients, strict=True)):
        reads = _head_reads(reader, tensors, grads, resid[layer])  # (B, N, C, 3 H)
        check_close(f"{graph.blocks[layer]}'s gradient through its heads' queries, keys and "
                    "values", reads.sum(-1), inputs[2 * layer],
                    "the gradient at its attention input",
                    "its attention reads the stream beside them (a gate, or a projection that "
                    "ran other than once), so qkv=True cannot split its input into them; use "
                    "qkv=False")  # fmt: skip
        row = 0
        for place, delta in groups:
            if place > 2 * layer:  # this node and those after it write after block l reads
                break
            count = delta.shape[2]  # a product per token: no copy of delta (B, N, K, C)
            qkv[:, row : row + count, layer] = (delta @ reads).sum(1).unflatten(-1, (3, -1))
            row += count
    return qkv


def _head_reads(
    reader: QKVReader, tensors: list[Tensor], gradients: tuple[Tensor, ...], stream: Tensor
) -> Tensor:  # fmt: skip
    """(B, N, C, 3 H) the gradient at ``stream`` (the stream entering the block) through each
    head's query, key and value alone, query heads first: one head's slice of the gradients at
    the ``tensors`` that hold them, pulled back (3 H vector-Jacobian products)."""
    pulled = [_pullback(tensors[index], stream, masked)
              for index, masked in reader.head_gradients(gradients)]  # fmt: skip
    return torch.stack(pulled, -1)


def _stream_writes(diff: Points) -> list[tuple[int, Tensor]]:
    """The upstream nodes in graph order, grouped as they write: each group's position in the
    stream (`ComponentGraph.writes_at`) and its nodes' differences there (B, N, K, C), K = 1 or
    a block's heads (``diff.z``: each head's, (B, N, H, C) per block)."""
    groups = [(0, diff.resid[0][:, :, None])]
    for layer in range(len(diff.attn)):
        attention = diff.attn[layer][:, :, None] if diff.z is None else diff.z[layer]
        groups += [(2 * layer + 1, attention), (2 * layer + 2, diff.mlp[layer][:, :, None])]
    return groups
