"""Each head's output before the attention's output projection, z_h (B, N, d): read as its
slice of the projection's input, heads side by side (timm, transformers), or where the attention
is torch's fused MultiheadAttention, as its weights times its values
(`vizkit.head_outputs.fused`). The projection is linear, so the head writes W_O^h z_h to the
stream and a change of z_h changes the score by that change times the score's gradient at z_h
(Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits", Sec. 2.2: the
attention output as a sum over heads)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from ..analysis.residual_stream import edited_forward, output_projections, pattern_name
from ..hooks import HookedModel
from .fused import MultiheadInput, unreadable

__all__ = [
    "HeadInputs",
    "HeadReader",
    "ProjectionInput",
    "ProjectionMap",
    "check_read",
    "head_inputs",
    "multihead_inputs",
    "projection_maps",
]

TOLERANCE = 1e-4  # relative to the output's largest magnitude


class HeadReader(Protocol):
    """How one block's heads' outputs z (B, N, H d) are read and set."""

    @property
    def heads(self) -> int: ...

    def reading(self, append: Callable[[Tensor], None]) -> AbstractContextManager:
        """Hooks that pass each forward's z (B, N, H d) to ``append``."""

    def probing(self, basis: Tensor) -> AbstractContextManager:
        """Hooks that make the block's attention output what the heads' outputs ``basis``
        (B, N, H d) give."""


@dataclass(frozen=True)
class ProjectionInput:
    """A block whose heads' outputs are its output projection's input, side by side."""

    projection: nn.Module
    heads: int

    @contextmanager
    def reading(self, append: Callable[[Tensor], None]) -> Iterator[None]:
        with _hooked(self.projection.register_forward_pre_hook(lambda m, args: append(args[0]))):
            yield

    @contextmanager
    def probing(self, basis: Tensor) -> Iterator[None]:
        def set_basis(module: nn.Module, args: tuple) -> tuple:
            return (basis.to(args[0].dtype), *args[1:])

        with _hooked(self.projection.register_forward_pre_hook(set_basis)):
            yield


@dataclass(frozen=True)
class HeadInputs:
    """Per block (``blocks``), the `HeadReader` of its heads' outputs."""

    blocks: tuple[str, ...]
    readers: tuple[HeadReader, ...]

    @property
    def heads(self) -> tuple[int, ...]:
        return tuple(reader.heads for reader in self.readers)

    @contextmanager
    def reading(self, append: Callable[[Tensor], None]) -> Iterator[None]:
        """Every block's reading hooks: ``append`` gets each block's z as it runs."""
        with ExitStack() as stack:
            for reader in self.readers:
                stack.enter_context(reader.reading(append))
            yield

    @contextmanager
    def probing(self, basis: Tensor) -> Iterator[None]:
        """Every block's attention output made what the heads' outputs ``basis`` give."""
        with ExitStack() as stack:
            for reader in self.readers:
                stack.enter_context(reader.probing(basis))
            yield


def head_inputs(hm: HookedModel, x: Tensor, blocks: list[str]) -> HeadInputs:
    """The readers of the heads' outputs of ``blocks`` on images x (B, C, H, W): torch's
    MultiheadAttention read by its weights and values (`multihead_inputs`); any other
    attention at its output projection's input, checked to take the heads' outputs side by
    side in head order: with one head's slice of every projection's input zeroed, the model
    gives the same logits as with that head's attention map zeroed in every block (one image,
    H copies, two forwards). Where the maps cannot be edited on the output's path
    (transformers compute them beside the output), the slices are taken in head order
    unchecked, as `vizkit.analysis.residual_stream.head_outputs` splits heads there.

    Raises:
        ValueError: a block without one attention map or an output projection, a
            MultiheadAttention that cannot be read, or heads that are not the projection
            input's slices in order; use heads=False (each block's attention as one node)."""
    patterns = [_pattern(hm, block) for block in blocks]
    fused = multihead_inputs(hm, x, blocks)
    others = [(b, p) for b, p in zip(blocks, patterns, strict=True) if b not in fused.blocks]
    readers = dict(zip(fused.blocks, fused.readers, strict=True))
    if others:
        readers.update(_projection_inputs(hm, x[:1], *map(list, zip(*others, strict=True))))
    return HeadInputs(tuple(blocks), tuple(readers[block] for block in blocks))


def multihead_inputs(hm: HookedModel, x: Tensor, blocks: list[str]) -> HeadInputs:
    """The readers of those ``blocks`` whose attention is torch's ``nn.MultiheadAttention``
    (`vizkit.head_outputs.fused`), checked on the first image of x (B, C, H, W): the heads'
    outputs through ``out_proj`` give the module's output.

    Raises:
        ValueError: a MultiheadAttention that cannot be read that way, or whose heads'
            outputs do not give its output."""
    readers = {}
    for block in blocks:
        module = _attention(hm, block)
        if isinstance(module, nn.MultiheadAttention):
            why = unreadable(module)
            if why is not None:
                raise ValueError(_without_heads(f"{block}'s MultiheadAttention", why))
            readers[block] = MultiheadInput(module)
    found = HeadInputs(tuple(readers), tuple(readers.values()))
    if readers:
        _check_rebuilt(hm, x[:1], found)
    return found


@torch.no_grad()
def _check_rebuilt(hm: HookedModel, x: Tensor, found: HeadInputs) -> None:
    """The heads' outputs read on x (1, C, H, W) give each MultiheadAttention's output."""
    z: list[Tensor] = []
    outputs: list[Tensor] = []
    attention = [reader.attention for reader in found.readers]
    with ExitStack() as stack:
        stack.enter_context(found.reading(z.append))
        for module in attention:
            handle = module.register_forward_hook(lambda m, args, out: outputs.append(out[0]))
            stack.callback(handle.remove)
        hm.model(x)
    check_read(z, found)
    for block, reader, own_z, output in zip(found.blocks, found.readers, z, outputs, strict=True):
        if not _close(reader.output_of(own_z), output):
            raise ValueError(_without_heads(
                f"{block}'s MultiheadAttention", "does not give its output as its weights times "
                "its values through out_proj"))  # fmt: skip


def _projection_inputs(
    hm: HookedModel, x: Tensor, blocks: list[str], patterns: list[str]
) -> dict[str, ProjectionInput]:
    """Each block's output projection, found and checked on x (1, C, H, W)."""
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, patterns, pattern_path="unfused")
    counts = [cache[pattern].shape[1] for pattern in patterns]
    projections = output_projections(hm, x, blocks, counts)
    for block, projection in zip(blocks, projections, strict=True):
        if projection is None:
            raise ValueError(_without_heads(block, "has no output projection vizkit can read "
                                                   "(a fused attention kernel)"))  # fmt: skip
    _check_head_order(hm, x, patterns, projections, counts)
    return {b: ProjectionInput(p, c) for b, p, c in zip(blocks, projections, counts, strict=True)}


def _attention(hm: HookedModel, block: str) -> nn.Module | None:
    """The module that gives the attention map of ``block``, None where it has no one map."""
    pattern = pattern_name(hm, block)
    return None if pattern is None else hm.model.get_submodule(pattern.rsplit(".", 1)[0])


def _pattern(hm: HookedModel, block: str) -> str:
    pattern = pattern_name(hm, block)
    if pattern is None:
        raise ValueError(_without_heads(block, "has no single attention map (hook_pattern)"))
    return pattern


@contextmanager
def _hooked(handle: RemovableHandle) -> Iterator[None]:
    try:
        yield
    finally:
        handle.remove()


def _check_head_order(
    hm: HookedModel, x: Tensor, patterns: list[str], projections: list[nn.Module],
    counts: list[int],
) -> None:  # fmt: skip
    """Zero head h in every block of copy h of the image x (1, C, H, W), once by its map and
    once by its slice of the projection input; the logits must agree."""
    copies = max(counts)

    def zero_map(p: Tensor) -> Tensor:  # (copies, 1, H, N, N)
        keep = 1 - torch.eye(copies, p.shape[2], dtype=p.dtype, device=p.device)
        return p * keep.view(copies, 1, p.shape[2], *[1] * (p.ndim - 3))

    def zero_slice(module: nn.Module, args: tuple) -> tuple:
        z = args[0]  # (copies, ..., H * d)
        heads = counts[projections.index(module)]
        keep = 1 - torch.eye(copies, heads, dtype=z.dtype, device=z.device)
        parts = z.view(copies, *z.shape[1:-1], heads, z.shape[-1] // heads)
        mask = keep.view(copies, *[1] * (z.ndim - 2), heads, 1)
        return ((parts * mask).reshape(z.shape), *args[1:])

    try:
        by_map = edited_forward(hm, x, dict.fromkeys(patterns, zero_map), copies)
    except ValueError:  # the maps are computed beside the output (transformers' attention):
        return  # the slices are taken in head order, as `head_outputs` takes them there
    handles = [p.register_forward_pre_hook(zero_slice) for p in dict.fromkeys(projections)]
    try:
        by_slice = edited_forward(hm, x, {}, copies)
    finally:
        for handle in handles:
            handle.remove()
    if not _close(_outputs(by_slice), _outputs(by_map)):
        raise ValueError(_without_heads(
            "the attention", "takes its heads' outputs in another order than side by side at "
            "the output projection's input"))  # fmt: skip


@dataclass(frozen=True)
class ProjectionMap:
    """A block's attention output as an affine function of its heads' outputs at each token:
    attn_out[:, n] = z[:, n] @ weight.T + bias[n], weight (C, H d), bias (N, C); so head h
    writes z_h @ weight[:, its slice].T."""

    weight: Tensor
    bias: Tensor

    def each_head(self, z: Tensor, heads: int) -> Tensor:
        """(B, N, H, C) what each of the ``heads`` heads of z (B, N, H d) writes."""
        weight = self.weight.view(self.weight.shape[0], heads, -1)  # (C, H, d)
        return torch.einsum("bnhe,che->bnhc", z.unflatten(-1, (heads, -1)), weight)

    def of_heads(self, z: Tensor, keep: Tensor) -> Tensor:
        """(..., N, C) what the heads ``keep`` ((H,) bool) of z (..., N, H d) write together."""
        mask = keep.to(z.device, z.dtype).repeat_interleave(z.shape[-1] // len(keep))
        return (z * mask) @ self.weight.T

    def check(self, block: str, z: Tensor, attn: Tensor) -> None:
        """Refuse the map where it does not give a run's attention output attn (B, N, C) from
        its heads' outputs z (B, N, H d)."""
        if not _close(z @ self.weight.T + self.bias, attn):
            raise ValueError(_without_heads(
                block, "is not one affine map of its heads' outputs at each token"))  # fmt: skip


def projection_maps(
    hm: HookedModel, x: Tensor, found: HeadInputs, z: list[Tensor], attn: list[Tensor]
) -> list[ProjectionMap]:
    """Each block's `ProjectionMap`, measured on one image of x (B, C, H, W) by setting its
    heads' outputs to basis vectors, a token each (copies of the image: `HeadReader.probing`,
    so what lies between the heads and ``hook_attn_out`` is measured too), and checked on
    the run whose heads' outputs ``z`` and attention outputs ``attn`` (per block) are given.

    Raises:
        ValueError: the map is not one affine map per token (the output is not linear in the
            heads, or a token's output reads other tokens' heads)."""
    tokens, width = z[0].shape[-2], z[0].shape[-1]
    if any(t.ndim != 3 or t.shape[-2:] != (tokens, width) for t in z):
        raise ValueError(_without_heads("a block", "gives its projection other than (B, N, H d)"))
    copies = -(-width // tokens) + 1  # the basis over the tokens of copies, then a zero copy
    basis = torch.zeros(copies * tokens, width, dtype=z[0].dtype, device=x.device)
    basis[:width] = torch.eye(width, dtype=z[0].dtype, device=x.device)
    probe = basis.view(copies, tokens, width)
    outputs: dict[str, Tensor] = {}

    def keep(name: str):
        def read(t: Tensor) -> Tensor:  # (copies, 1, N, C)
            outputs[name] = t[:, 0].clone()
            return t

        return read

    names = [f"{block}.hook_attn_out" for block in found.blocks]
    with found.probing(probe):
        edited_forward(hm, x[:1], {n: keep(n) for n in names}, copies)
    maps = []
    for block, name, own_z, own_attn in zip(found.blocks, names, z, attn, strict=True):
        out = outputs[name].flatten(0, 1)  # (copies N, C)
        bias = outputs[name][-1]  # (N, C)
        columns = out[:width] - bias.repeat(copies - 1, 1)[:width]
        made = ProjectionMap(columns.T.contiguous(), bias)
        made.check(block, own_z, own_attn)
        maps.append(made)
    return maps


def check_read(z: list[Tensor], found: HeadInputs) -> None:
    """Refuse a run that read the heads' outputs ``z`` other than once per block."""
    if len(z) != len(found.blocks):
        raise ValueError(
            f"The heads' outputs were read {len(z)} times for {len(found.blocks)} blocks; each "
            "block's attention must run once per forward for its heads to be read. Use "
            "heads=False."
        )


def _close(value: Tensor, expected: Tensor) -> bool:
    """Whether ``value`` is ``expected`` to `TOLERANCE` of the latter's largest magnitude."""
    scale = expected.abs().max().clamp_min(1e-12)
    return float((value - expected).abs().max() / scale) <= TOLERANCE  # NaN: False


def _outputs(output: object) -> Tensor:
    """The floating-point tensors of a model output, flattened and joined."""
    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, Tensor)]
    return torch.cat([t.float().flatten() for t in tensors if t.is_floating_point()])


def _without_heads(where: str, why: str) -> str:
    return (
        f"{where} {why}, so its heads' outputs cannot be read one by one. Use heads=False: each "
        "block's attention is then one node."
    )
