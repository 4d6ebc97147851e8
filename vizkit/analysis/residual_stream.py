"""The residual stream as a sum of parts, and the head read off it: what the mechanistic views
(direct logit attribution, the logit lens, activation patching, ablation) share.

In a pre-norm transformer the stream after the last block is the stream entering the first
block plus every attention and MLP output: x_L = x_0 + Σ_l (attn_l + mlp_l). Where each
attention output is W_O (concatenated heads) + b_O, it splits further into one term per head.
The head (final norm, pooling, classifier) is affine in the stream once each norm's scale is
frozen at its value on a clean run; this is the decomposition TransformerLens uses for direct
logit attribution (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits").
Every step is checked on the model at hand, and refused with the reason where it fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..hooks import HookedModel
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.scores import model_logits
from ..targets import embedding_of

__all__ = [
    "BRANCHES",
    "StreamReadout",
    "StreamRun",
    "block_activations",
    "check_close",
    "edited_forward",
    "head_outputs",
    "norm_scale",
    "norm_with_scale",
    "output_projection",
    "output_projections",
    "part_names",
    "pattern_name",
    "post_block_scales",
    "residual_blocks",
    "split_stream",
    "stream_parts",
    "stream_run",
]

BRANCHES = ("hook_attn_out", "hook_mlp_out")
TOLERANCE = 1e-4  # relative to the largest magnitude of the compared quantity


def residual_blocks(hm: HookedModel) -> list[str]:
    """The paths of the model's blocks, each naming its stream and both branches.

    Raises:
        ValueError: the model has no blocks vizkit knows, or they do not name a two-branch
            residual stream (``hook_resid_pre``, ``hook_attn_out``, ``hook_mlp_out``,
            ``hook_resid_post``)."""
    family = hm.family
    if family is None or not family.blocks:
        raise ValueError(
            f"{type(hm.model).__name__} has no transformer blocks vizkit knows, so its residual "
            "stream cannot be decomposed; the mechanistic views need a registered family "
            "(docs/coverage.md)."
        )
    known = set(hm.hook_names())
    paths = [block.path for block in family.blocks]
    leaves = ("hook_resid_pre", *BRANCHES, "hook_resid_post")
    missing = [f"{p}.{leaf}" for p in paths for leaf in leaves if f"{p}.{leaf}" not in known]
    if missing:
        raise ValueError(
            f"The {family.family} family's blocks do not name a two-branch residual stream "
            f"(no {', '.join(missing[:3])}); the mechanistic views need attention and MLP "
            "outputs added to one stream."
        )
    return paths


def block_activations(hm: HookedModel, x: Tensor) -> tuple[dict[str, Tensor], object]:
    """One run on x: each block's ``hook_resid_pre``, ``hook_attn_out``, ``hook_mlp_out`` and
    ``hook_resid_post`` by name, and the model's output."""
    leaves = ("hook_resid_pre", *BRANCHES, "hook_resid_post")
    names = [f"{p}.{leaf}" for p in residual_blocks(hm) for leaf in leaves]
    with torch.no_grad():
        output, cache = hm.run_with_cache(x, names)
    _require_finite(output)
    return {n: cache[n] for n in names}, output


def _require_finite(output: object) -> None:
    """Refuse a model output (logits) holding NaN or infinities."""
    logits = model_logits(output)
    if isinstance(logits, Tensor) and not bool(torch.isfinite(logits).all()):
        raise ValueError(
            "The model's output holds NaN or infinite values on these images, so no score "
            "computed from it means anything; check the model's weights and the inputs."
        )


def stream_parts(hm: HookedModel, x: Tensor) -> tuple[Tensor, list[str], Tensor, object]:
    """One clean run: the parts of the final stream, (P, B, N, C) for the stream entering the
    first block ("embed") and each block's attention and MLP outputs, their names, the final
    stream (B, N, C) and the model's output.

    Raises:
        ValueError: the parts do not add up to the final stream (a post-norm block, stages that
            merge patches or change the width, CaiT's class-attention stage)."""
    acts, output = block_activations(hm, x)
    return (*split_stream(acts, residual_blocks(hm)), output)


def part_names(blocks: list[str]) -> list[str]:
    """The activations the stream's parts are read from: the first block's input, then each
    block's attention and MLP outputs, then the last block's output."""
    names = [f"{blocks[0]}.hook_resid_pre"]
    names += [f"{p}.{branch}" for p in blocks for branch in BRANCHES]
    return [*names, f"{blocks[-1]}.hook_resid_post"]


def split_stream(acts: dict[str, Tensor], blocks: list[str]) -> tuple[Tensor, list[str], Tensor]:
    """`stream_parts` of activations already read (``acts``: at least `part_names`)."""
    *names, final = part_names(blocks)
    shapes = {tuple(acts[n].shape) for n in [*names, final]}
    if len(shapes) != 1:
        raise ValueError(
            f"The blocks' streams differ in shape ({sorted(shapes)[:3]}): the model changes its "
            "tokens or width between blocks (patch merging, a class-attention stage), so its "
            "output is not one sum of block outputs."
        )
    parts = torch.stack([acts[n] for n in names])
    check_close("The block outputs' sum", parts.sum(0), acts[final], "the final stream",
                 "a block adds more than its attention and MLP outputs (post-norm blocks, "
                 "a scaled or gated residual)")  # fmt: skip
    labels = ["embed"] + [f"{p} {b.removeprefix('hook_').removesuffix('_out')}"
                          for p in blocks for b in BRANCHES]  # fmt: skip
    return parts, labels, acts[final]


@dataclass
class StreamRun:
    """One clean run read for the stream's decomposition (`stream_run`).

    Attributes:
        output: the model's output.
        acts: name -> activation: the `part_names` and the others asked for (with ``rows``:
            their first rows, the final stream whole).
        parts: (P, B, N, C) the stream's parts (N: ``rows`` where given), ``labels`` their
            names, ``final`` (B, N, C) the last block's output: `split_stream` of ``acts``.
        scales: `post_block_scales` of the run.
        rows: the tokens kept of the parts and maps; None: all.
    """

    output: object
    acts: dict[str, Tensor]
    parts: Tensor
    labels: list[str]
    final: Tensor
    scales: list
    rows: int | None = None

    def readout(self, hm: HookedModel, x: Tensor, blocks: list[str]) -> StreamReadout:
        """The `StreamReadout` of this run (on images x, the run's input)."""
        return StreamReadout(hm, x, blocks, (self.output, self.final, self.scales))


def stream_run(
    hm: HookedModel, x: Tensor, blocks: list[str], names: Sequence[str] = (),
    rows: int | None = None,
) -> StreamRun:  # fmt: skip
    """One clean run of x (B, C, H, W), without gradients, reading the stream's `part_names`,
    ``names`` and the post-block norms' scales, its stream split (`split_stream`).

    Args:
        rows: keep only each part's first ``rows`` tokens (B, R, C) and each map's first
            ``rows`` query rows (B, H, R, N), cut in the forward (the final stream whole), for
            a head that reads only those; None: every token.

    Raises:
        ValueError: the stream is not one sum of the blocks' outputs."""
    read = list(dict.fromkeys([*part_names(blocks), *names]))
    last = part_names(blocks)[-1]
    with post_block_scales(hm.model, blocks[-1]) as scales, torch.no_grad():
        if rows is None:
            output, cache = hm.run_with_cache(x, read)
            acts = {n: cache[n] for n in read}
        else:
            output, acts = _first_rows_run(hm, x, read, rows, last)
    cut = acts if rows is None else {**acts, last: acts[last][:, :rows]}
    parts, labels, _ = split_stream(cut, blocks)
    return StreamRun(output, acts, parts, labels, acts[last], scales, rows)


def _first_rows_run(
    hm: HookedModel, x: Tensor, names: list[str], rows: int, whole: str
) -> tuple[object, dict[str, Tensor]]:
    """The model's output on x and each of ``names`` cut to its first ``rows`` tokens as the
    forward makes it (a map (B, H, N, N) to its first query rows), ``whole`` kept whole."""
    acts: dict[str, Tensor] = {}

    def keep(t: Tensor, *, name: str) -> None:
        if name == whole:
            acts[name] = t.detach().clone()
        elif name.endswith(".hook_pattern"):
            acts[name] = t.detach()[:, :, :rows].clone()
        else:
            acts[name] = t.detach()[:, :rows].clone()

    with hm.hooks(fwd=dict.fromkeys(names, keep), read_only=True):
        output = hm.model(x)
    return output, acts


def check_close(what: str, value: Tensor, expected: Tensor, of: str, reason: str) -> None:
    scale = expected.abs().max().clamp_min(1e-12)
    error = float((value - expected).abs().max() / scale)
    if not error <= TOLERANCE:  # NaN fails too
        raise ValueError(f"{what} differs from {of} by {error:.1e} of its scale: {reason}.")


@contextlib.contextmanager
def post_block_scales(model: nn.Module, last_block: str) -> Iterator[list]:
    """A list filled, during one forward inside the context, with (norm, its scale) for each
    norm called after the block ``last_block`` (the readout's norms, in call order)."""
    scales: list[tuple[nn.Module, Tensor]] = []
    finished = {"last": False}

    def after_last(module, args, output) -> None:
        finished["last"] = True

    def record_scale(module, args, output) -> None:
        if finished["last"]:
            scales.append((module, norm_scale(module, args[0])))

    handles = [model.get_submodule(last_block).register_forward_hook(after_last)]
    handles += [m.register_forward_hook(record_scale) for m in model.modules() if _is_norm(m)]
    try:
        yield scales
    finally:
        for handle in handles:
            handle.remove()


class StreamReadout:
    """The model's logits had its last block output a given stream (kB, N, C): by the family's
    readout (`FamilyLayout.readout`) where it reproduces the model's output, else by the model's
    forward on the images repeated k times with the last block's output replaced. With
    ``frozen=True`` the norms that run after the last block divide by their scale on the clean
    run, so the readout is affine in the stream (for B-image streams only)."""

    def __init__(
        self, hm: HookedModel, x: Tensor, blocks: list[str], run: tuple | None = None
    ) -> None:
        """``run``: (output, final stream, `post_block_scales`) of a clean run on x already
        made; None: one is made here."""
        self.hm, self.x = hm, x
        self.last = f"{blocks[-1]}.hook_resid_post"
        if run is None:
            with post_block_scales(hm.model, blocks[-1]) as scales, torch.no_grad():
                output, cache = hm.run_with_cache(x, self.last)
            run = output, cache[self.last], scales
        output, self.stream, self.scales = run
        _require_finite(output)
        self.logits = model_logits(output)
        self.readout = self._family_readout(output)

    def _family_readout(self, output: object) -> Callable[[Tensor], Tensor] | None:
        readout = self.hm.family.readout
        if readout is None:
            return None
        try:
            with torch.no_grad():
                read = readout(self.stream)
        except (TypeError, ValueError, RuntimeError):
            return None
        expected = self.logits
        if not isinstance(expected, Tensor):  # an output object: its image embedding
            try:
                expected = embedding_of(output)
            except (TypeError, ValueError):
                return None
        if read.shape != expected.shape:
            return None
        close = torch.allclose(read.float(), expected.float(), rtol=1e-4, atol=1e-5)
        return readout if close else None

    def __call__(self, stream: Tensor, frozen: bool = False) -> Tensor:
        """(kB, K) logits for streams (kB, N, C)."""
        repeats, rest = divmod(len(stream), len(self.x))
        if rest or (frozen and repeats != 1):
            raise ValueError(
                f"The readout takes streams of k x {len(self.x)} images "
                f"({'exactly 1 x when frozen' if frozen else 'k >= 1'}); got {len(stream)}."
            )
        with self._frozen_norms() if frozen else contextlib.nullcontext():
            if self.readout is not None:
                return self.readout(stream)
            with self.hm.hooks(fwd={self.last: lambda t, *, name: stream}):
                images = self.x.repeat(repeats, *[1] * (self.x.ndim - 1))
                return model_logits(self.hm.model(images))

    def first_rows(self, stream: Tensor) -> Tensor:
        """(kB, K) the frozen family readout of streams (kB, R, C) cut to the first R tokens
        (each norm's clean scale cut and repeated to match), for a readout that reads only
        those: `read_rows` and a comparison with the whole stream's readout say whether it
        does. Raises ValueError where the family has no readout (the model's forward needs
        every token)."""
        if self.readout is None:
            raise ValueError("The readout runs the model's forward, which needs every token.")
        repeats, rows = len(stream) // len(self.x), stream.shape[1]
        with self._frozen_norms(rows, repeats):
            return self.readout(stream)

    @contextlib.contextmanager
    def _frozen_norms(self, rows: int | None = None, repeats: int = 1) -> Iterator[None]:
        """The post-block norms divide by their clean scales (the first ``rows`` tokens'
        where given, repeated ``repeats`` times along the batch)."""
        calls = {id(m): [s for n, s in self.scales if n is m] for m, _ in self.scales}
        position = dict.fromkeys(calls, 0)

        def frozen(module, args, output):
            scale = calls[id(module)][position[id(module)]]
            position[id(module)] += 1
            if rows is not None and scale.ndim == 3:
                scale = scale[:, :rows]
            if repeats > 1:
                scale = scale.repeat(repeats, *[1] * (scale.ndim - 1))
            return norm_with_scale(module, args[0], scale)

        modules = {id(m): m for m, _ in self.scales}.values()
        handles = [m.register_forward_hook(frozen) for m in modules]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def linear_score(self, score: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
        """The frozen readout's ``score`` (logits (B, K) -> (B,)) as gradient (B, N, C) and
        constant (B,): score(readout(s)) = (gradient * s).sum((1, 2)) + constant, checked at
        the clean stream.

        Raises:
            ValueError: the frozen readout with ``score`` is not affine in the stream there (a
                norm vizkit cannot freeze, an attention-pooling or MLP head, a nonlinear
                ``score``)."""
        stream = self.stream.detach().clone().requires_grad_(True)
        with torch.enable_grad(), frozen_parameters(self.hm.model):
            value = score(self(stream, frozen=True))
            (gradient,) = torch.autograd.grad(value.sum(), stream)
        with torch.no_grad():
            constant = score(self(torch.zeros_like(self.stream), frozen=True))
            clean = score(self.logits)
        check_close("The frozen head's value at the clean stream", value.detach(), clean,
                     "the model's", "a norm after the blocks vizkit cannot freeze")  # fmt: skip
        linear = (gradient * self.stream).flatten(1).sum(1) + constant
        check_close("The frozen head's linear part", linear, clean, "its value",
                     "the head is not affine in the stream once its norms are frozen "
                     "(an attention-pooling or MLP head)")  # fmt: skip
        return gradient, constant


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm | nn.RMSNorm) or type(module).__name__ == "RmsNorm"


def norm_scale(module: nn.Module, x: Tensor) -> Tensor:
    """The divisor a LayerNorm or RMSNorm applies to ``x`` (..., C), keepdim."""
    x = x.float()
    eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
    if isinstance(module, nn.LayerNorm):
        return (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    return (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def norm_with_scale(module: nn.Module, x: Tensor, scale: Tensor) -> Tensor:
    """The norm of ``x`` with its divisor fixed to ``scale``: centred (LayerNorm), divided,
    then its affine weight and bias."""
    if isinstance(module, nn.LayerNorm):
        x = x - x.mean(-1, keepdim=True)
    out = x / scale.to(x.dtype)
    if getattr(module, "weight", None) is not None:
        out = out * module.weight
    if getattr(module, "bias", None) is not None:
        out = out + module.bias
    return out


def pattern_name(hm: HookedModel, block: str) -> str | None:
    """The attention map of ``block`` (its one ``hook_pattern``), None where it has none or
    several (talking heads' mixed map beside it: the heads are mixed after the softmax)."""
    names = [n for n in hm.hook_names() if n.startswith(f"{block}.")
             and n.rsplit(".", 1)[-1].startswith("hook_pattern")]  # fmt: skip
    return names[0] if len(names) == 1 and names[0].endswith(".hook_pattern") else None


def edited_forward(
    hm: HookedModel, x: Tensor, edits: dict[str, Callable[[Tensor], Tensor]], copies: int
) -> object:
    """The model's output on ``x`` (B, C, H, W) repeated ``copies`` times, each named activation
    (copies * B, ...) replaced by ``edits[name]`` of it viewed as (copies, B, ...)."""

    def edit(fn: Callable[[Tensor], Tensor]) -> Callable:
        def replace(t: Tensor, *, name: str) -> Tensor:
            return fn(t.view(copies, -1, *t.shape[1:])).reshape(t.shape)

        return replace

    with torch.no_grad(), hm.hooks(fwd={n: edit(fn) for n, fn in edits.items()}):
        return hm.model(x.repeat(copies, *[1] * (x.ndim - 1)))


def require_full_precision(x: Tensor, what: str) -> None:
    """Refuse half-precision images (and so a half-precision model) for ``what``, whose
    additivity checks hold to 1e-4: bfloat16 and float16 round to about 1e-2."""
    if x.dtype in (torch.bfloat16, torch.float16):
        raise ValueError(
            f"{what} checks that the parts sum to the whole to 1e-4, and {x.dtype} rounds to "
            "about 1e-2, so the check cannot tell a decomposition from rounding. Run it in "
            "float32: model.float() and x.float() (the maps are the same up to that rounding)."
        )


def head_outputs(hm: HookedModel, x: Tensor, blocks: list[str], attn: list[Tensor]) -> list[Tensor]:
    """Per block (H + 1, B, N, C): its attention output split by head, f_h = W_O^h z_h (the
    output with every other head's attention zeroed, less the output with all zeroed), the
    last entry the output bias b_O; ``attn`` the blocks' clean outputs they must sum to.

    Raises:
        ValueError: a block without one attention map, or whose output is not linear in its
            heads (a norm between heads and projection, talking heads)."""
    require_full_precision(x, "Splitting attention outputs by head")
    per_block = []
    for block, output in zip(blocks, attn, strict=True):
        split = _split_heads(hm, x, block)
        check_close(f"{block}'s heads' outputs plus its bias", split.sum(0), output,
                     "its attention output", "its output is not linear in its heads (a norm "
                     "before the projection, heads mixed after the softmax)")  # fmt: skip
        per_block.append(split)
    return per_block


def _split_heads(hm: HookedModel, x: Tensor, block: str) -> Tensor:
    """(H + 1, B, N, C) the attention output of ``block`` with one head kept (the others'
    maps zeroed, or where a map cannot be edited on the output's path, their slices of the
    output projection's input), less the output with every head zeroed; then that output (the
    bias)."""
    pattern = pattern_name(hm, block)
    if pattern is None:
        raise ValueError(
            f"{block} has no single attention map (hook_pattern) to split its heads at (none, "
            "or several: heads mixed after the softmax, as talking heads)."
        )
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, pattern, pattern_path="unfused")
    heads = cache[pattern].shape[1]
    keep = torch.cat([torch.eye(heads), torch.zeros(1, heads)]).to(x.device)  # (H + 1, H)
    captured = {}

    def zero_heads(p: Tensor) -> Tensor:  # (H + 1, B, H, ...)
        return p * keep.view(heads + 1, 1, heads, *[1] * (p.ndim - 3)).to(p.dtype)

    def read(t: Tensor) -> Tensor:
        captured["out"] = t.clone()
        return t

    out = f"{block}.hook_attn_out"
    try:
        edited_forward(hm, x, {pattern: zero_heads, out: read}, heads + 1)
    except ValueError as refused:  # a map computed beside the output
        projection = output_projection(hm, x, block, heads)
        if projection is None:
            raise ValueError(
                f"{refused} No output projection to split the heads at either."
            ) from refused

        def zero_slices(module, args):  # (H + 1) * B, ..., H * d
            z = args[0]
            parts = z.view(heads + 1, -1, *z.shape[1:-1], heads, z.shape[-1] // heads)
            mask = keep.view(heads + 1, 1, *[1] * (z.ndim - 2), heads, 1).to(z.dtype)
            return ((parts * mask).reshape(z.shape), *args[1:])

        handle = projection.register_forward_pre_hook(zero_slices)
        try:
            edited_forward(hm, x, {out: read}, heads + 1)
        finally:
            handle.remove()
    only, none = captured["out"][:heads], captured["out"][heads:]
    return torch.cat([only - none, none])


def output_projection(hm: HookedModel, x: Tensor, block: str, heads: int) -> nn.Module | None:
    """The output projection of ``block`` (`output_projections` of one block)."""
    return output_projections(hm, x, [block], [heads])[0]


def output_projections(
    hm: HookedModel, x: Tensor, blocks: list[str], heads: list[int]
) -> list[nn.Module | None]:
    """Per block, the Linear that maps its heads' concatenated outputs to the stream (the
    output projection: transformers' ``o_proj``): the last Linear of the block called before
    its attention output is added, whose input is not also another Linear's input (the
    queries', keys' and values' projections share theirs) and is a multiple of its ``heads``
    wide. None where there is none (a fused kernel, torch's MultiheadAttention). One forward
    of the first image of x."""
    calls: dict[str, list[tuple[nn.Module, Tensor]]] = {b: [] for b in blocks}
    added: set[str] = set()

    def called(block: str):
        def hook(module, args, output):
            if block not in added:
                calls[block].append((module, args[0]))

        return hook

    def attention_added(t: Tensor, *, name: str) -> None:
        added.add(name.removesuffix(".hook_attn_out"))

    handles = [
        m.register_forward_hook(called(block))
        for block in blocks
        for m in hm.model.get_submodule(block).modules()
        if isinstance(m, nn.Linear)
    ]
    try:
        fwd = {f"{block}.hook_attn_out": attention_added for block in blocks}
        with torch.no_grad(), hm.hooks(fwd=fwd):
            hm.model(x[:1])
    finally:
        for handle in handles:
            handle.remove()
    return [_projection(calls[block], count) for block, count in zip(blocks, heads, strict=True)]


def _projection(calls: list[tuple[nn.Module, Tensor]], heads: int) -> nn.Module | None:
    """The last of a block's Linear ``calls`` (module, input) whose input no other shares."""
    for i in range(len(calls) - 1, -1, -1):
        linear, given = calls[i]
        shared = any(other is not linear and o.shape == given.shape and torch.equal(o, given)
                     for other, o in calls)  # fmt: skip
        if not shared:
            return linear if linear.in_features % heads == 0 else None
    return None
