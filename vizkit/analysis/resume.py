"""The model's forward resumed at a block: its output computed from the stream at a block's
input or output (``hook_resid_pre`` / ``hook_resid_post``, (B, N, C)) by the blocks after it
and the family's readout (`FamilyLayout.readout`), so an edit there costs those blocks alone.

A clean run proves the path before it is used: each later block was called once, on the
previous one's output and nothing else (no class token handed in beside the stream, no rotary
table, no mask), and the path on two of the run's images gives the model's forward on those
two alone (so no later module reads a value the clean run left behind: a token, a cache, a
batch statistic). Where the run cannot prove it, there is no resumed path and the caller runs
the whole model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..hooks import HookedModel
from ..hooks.contract import analysis_contract, held
from ..hooks.scores import model_logits
from ..targets import embedding_of

__all__ = [
    "LayerRun",
    "ResumedForward",
    "UNDECIDED",
    "block_calls",
    "contracted_layer_run",
    "layer_run",
    "output_tensor",
    "proved_run",
]

TOLERANCE = 1e-4  # of the outputs' largest magnitude: rounding, not another computation
UNDECIDED = "fewer than two different images in the run to check it on"


class ResumedForward:
    """streams (B, N, C) at the layer -> (B, K) the model's output tensor (logits, or the
    embedding where the output is an object): ``blocks`` in turn, then ``readout``."""

    def __init__(self, model: nn.Module, blocks: list[nn.Module], readout: Callable) -> None:
        self.model, self.blocks, self.readout = model, blocks, readout

    def __call__(self, stream: Tensor) -> Tensor:
        with held(self.model):  # eval mode, as the clean run it was proved on
            return self.forward(stream)

    def forward(self, stream: Tensor) -> Tensor:
        """The same for a caller that holds the model already (`held`, as every analysis
        does): many calls, no walk over its modules each."""
        with torch.no_grad():
            for block in self.blocks:
                stream = block(stream)
            return self.readout(stream)


@dataclass
class LayerRun:
    """One clean run: ``output`` the model's, ``stream`` (B, N, C) the activation at the
    layer, ``resumed`` the forward from there where the run proved it (else None, ``why``
    says why; `UNDECIDED` where another run may prove it)."""

    output: object
    stream: Tensor
    resumed: ResumedForward | None
    why: str = ""


@analysis_contract
def layer_run(
    model: nn.Module | HookedModel, x: Tensor, layer: str,
    read: Callable[[object], Tensor] | None = None,
) -> LayerRun:  # fmt: skip
    """One forward of images x (B, C, H, W) without gradients: the model's output, the
    activation ``layer`` and the `ResumedForward` from it, where this run proves it gives
    ``read`` of the output (default `output_tensor`; a ``read`` that is no tensor: no path)."""
    return contracted_layer_run(model, x, layer, read)


def contracted_layer_run(
    hm: HookedModel, x: Tensor, layer: str, read: Callable[[object], Tensor] | None = None
) -> LayerRun:
    """`layer_run` inside the caller's own analysis contract (which holds the model and says
    whether a video model's clips (B, T, C, H, W) are taken; `layer_run`'s refuses them)."""
    with torch.no_grad(), block_calls(hm, layer) as calls:
        output, cache = hm.run_with_cache(x, layer)
    return proved_run(hm, x, layer, calls, output, cache[layer], read)


@contextlib.contextmanager
def block_calls(hm: HookedModel, layer: str) -> Iterator[dict]:
    """Filled during one forward inside the context (for `proved_run`): ``"calls"``, per block
    after ``layer``, why each of its calls does not go on from the previous block's output
    ("" where it does: one tensor argument, equal to that output; a tensor returned), and
    ``"first"`` the first block's input. No tensor is kept past the next block's call."""
    start = _first_block(hm, layer)
    paths = [site.path for site in hm.family.blocks][start:] if start is not None else []
    seen: dict = {"calls": [[] for _ in paths], "first": None, "last": None}

    def called(i: int) -> tuple[Callable, Callable]:
        def before(module, args, kwargs) -> None:
            given, last = args[0] if len(args) == 1 else None, seen["last"]
            why = ""
            if kwargs or not isinstance(given, Tensor):
                why = "a block after the layer takes more than the stream (a class token, a mask)"
            elif i == 0:
                seen["first"] = given
            elif not (given is last or (isinstance(last, Tensor) and given.shape == last.shape
                                        and torch.equal(given, last))):  # fmt: skip
                why = "a block after the layer is not given the previous block's output"
            seen["calls"][i].append(why)

        def after(module, args, output) -> None:
            seen["last"] = output if isinstance(output, Tensor) else None
            if seen["last"] is None and not seen["calls"][i][-1]:
                seen["calls"][i][-1] = "a block after the layer returns more than the stream"

        return before, after

    handles = []
    try:
        for i, path in enumerate(paths):
            before, after = called(i)
            block = hm.model.get_submodule(path)
            handles.append(block.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(block.register_forward_hook(after))
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def proved_run(
    hm: HookedModel, x: Tensor, layer: str, calls: dict, output: object, stream: Tensor,
    read: Callable[[object], Tensor] | None = None,
) -> LayerRun:  # fmt: skip
    """The `LayerRun` of a clean forward of images x made inside `block_calls` (its
    ``calls``): its ``output`` and ``stream`` (B, N, C) the activation ``layer``."""
    start = _first_block(hm, layer)
    if start is None or hm.family.readout is None:
        why = "the layer is no block's input or output" if start is None else "no readout"
        return LayerRun(output, stream, None, f"{why}: the family has no path from it")
    why = _chained(calls, stream)
    blocks = [hm.model.get_submodule(site.path) for site in hm.family.blocks[start:]]
    resumed = None if why else ResumedForward(hm.model, blocks, hm.family.readout)
    why = why or _reproduces(hm, resumed, stream, x, read or output_tensor)
    return LayerRun(output, stream, None if why else resumed, why)


def output_tensor(output: object) -> Tensor:
    """The model output's tensor: its logits, or the embedding of an output object."""
    logits = model_logits(output)
    return logits if isinstance(logits, Tensor) else embedding_of(output)


def _first_block(hm: HookedModel, layer: str) -> int | None:
    """The index of the first block after ``layer`` (a block's input or output), else None."""
    if hm.family is None:
        return None
    paths = [site.path for site in hm.family.blocks]
    starts = {f"{p}.hook_resid_pre": i for i, p in enumerate(paths)}
    starts |= {f"{p}.hook_resid_post": i + 1 for i, p in enumerate(paths)}
    return starts.get(layer)


def _chained(seen: dict, stream: Tensor) -> str:
    """Why the blocks' calls (`block_calls`) are not one chain from ``stream`` ("" where they
    are): each block called once, the first on the stream, each next on the previous one's
    output."""
    for calls in seen["calls"]:
        if len(calls) != 1:
            return f"a block after the layer ran {len(calls)} times in one forward"
        if calls[0]:
            return calls[0]
    first = seen["first"]
    if seen["calls"] and not (first is stream or (first.shape == stream.shape
                                                  and torch.equal(first, stream))):  # fmt: skip
        return "the first block after the layer is not given its activation"
    return ""


def _reproduces(
    hm: HookedModel, resumed: ResumedForward, stream: Tensor, x: Tensor,
    read: Callable[[object], Tensor],
) -> str:  # fmt: skip
    """Why the resumed path on the streams of the last and first images (in that order) does
    not give the model's forward on those two images alone, run after it ("" where it does):
    a value the clean run left behind (a token, a cache, a batch statistic) that a later
    module reads would be the whole batch's, not the pair's."""
    if len(stream) < 2 or torch.equal(stream[0], stream[-1]):
        return UNDECIDED
    pair = [len(stream) - 1, 0]
    try:
        got = resumed(stream[pair])
    except (TypeError, ValueError, RuntimeError) as error:
        return f"the blocks after the layer do not run on the stream alone ({error})"
    with torch.no_grad():
        want = read(hm.model(x[pair]))
    if not (isinstance(got, Tensor) and isinstance(want, Tensor) and got.shape == want.shape):
        return "the family's readout does not give the model's output"
    scale = want.abs().max().clamp_min(1e-12)
    error = float((got.float() - want.float()).abs().max() / scale)
    if not error <= TOLERANCE:  # NaN fails too
        return f"the path from the layer differs from the model's forward by {error:.1e}"
    return ""
