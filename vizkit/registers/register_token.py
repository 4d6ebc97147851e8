"""A test-time register on the user's unmodified model (Jiang et al. 2025, "Vision Transformers
Don't Need Trained Registers", Sec. 4): extra tokens appended to the stream entering the first
block, and at each listed block the register neurons' activations moved onto them, so the
high-norm artifacts the neurons write into patches go to the register instead.

At a block with listed neurons S, for each image: the register tokens' activations of S become
``scale`` times the signed extreme of S's activations over all tokens (the largest magnitude,
with its sign: the reference's ``sign_max``), and the patches' activations of S become 0
(``patches="zero"``, the paper's default), their mean (``"mean"``) or stay (``"keep"``). Prefix
tokens (class, trained registers) keep theirs. The registers are dropped at the run's last
block, so whatever follows (final norm, pooling, head) sees the model's own tokens.

Departures from the reference code, which edits batch element 0 only: every image of the batch
gets its own extreme; trained registers are prefix tokens and keep their activations (the
reference zeroes every token between the class token and the extra ones); the registers leave
before the head, so an average or attention pooling does not read them (the reference keeps
them in open_clip's pooled tokens; trained registers are left out of DINOv2's patch pooling the
same way); the registers enter the first block as zeros (the reference appends them before
open_clip's ``ln_pre``, so there they enter as its bias)."""

from __future__ import annotations

import copy
import operator
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from ..datasets.model_input import model_preprocessing
from ..hooks import HookedModel
from ..hooks.contract import as_hooked, held
from ..hooks.inputs import check_choice, check_count
from ..hooks.scores import model_logits
from ..targets import embedding_of
from .sites import RegisterSites, register_sites

__all__ = ["PATCH_VALUES", "TestTimeRegister", "resolve_neurons", "test_time_register"]

PATCH_VALUES = ("zero", "mean", "keep")


@dataclass
class TestTimeRegister:
    """The open register: where it acts, and what its tokens held after the last forward.

    Attributes:
        sites: the run of blocks the registers pass through.
        neurons: block path -> the neuron indices moved there.
        registers: extra tokens appended (R).
        stream: (B, R, C) the register tokens at the run's last block output in the last
            forward (before they are dropped); None before a forward.
        tokens: (N + R) tokens the last forward's stream held inside the run.
    """

    sites: RegisterSites
    neurons: dict[str, list[int]]
    registers: int
    stream: Tensor | None = None
    tokens: int | None = None
    _entered: list[int] = field(default_factory=list, repr=False)


def resolve_neurons(sites: RegisterSites, neurons: object) -> dict[str, list[int]]:
    """Block path -> sorted neuron indices from ``neurons``: a `RegisterNeurons` result, or a
    mapping of blocks (``layer=`` vocabulary: int, block path) to neuron indices.

    Raises:
        ValueError / TypeError: an unknown block, an index out of the block's neurons, or none."""
    chosen = getattr(neurons, "by_block", None)
    if callable(chosen):
        neurons = chosen()
    if not isinstance(neurons, Mapping) or not neurons:
        raise TypeError(
            "neurons must be a RegisterNeurons result (vk.registers.register_neurons) or a "
            "non-empty dict of block -> neuron indices, e.g. {5: [17, 301]}; got "
            f"{type(neurons).__name__}."
        )
    resolved: dict[str, list[int]] = {}
    for layer, indices in neurons.items():
        blocks = sites.select(layer if isinstance(layer, str) else [layer], arg="neurons")
        if len(blocks) != 1:
            raise ValueError(f"neurons[{layer!r}] names {len(blocks)} blocks; name one per key.")
        block = blocks[0]
        count = sites.neurons[sites.blocks.index(block)]
        if isinstance(indices, Tensor | np.ndarray):
            indices = indices.tolist()
        if isinstance(indices, int) or not isinstance(indices, Sequence) or not indices:
            raise TypeError(
                f"neurons[{layer!r}] must be a non-empty list of ints; got {indices!r}."
            )
        chosen = [_index(layer, j) for j in indices]
        bad = [j for j in chosen if not 0 <= j < count]
        if bad:
            raise ValueError(
                f"neurons[{layer!r}] holds {bad[:5]}, not neuron indices of {block} "
                f"(its MLP has {count} neurons: 0..{count - 1})."
            )
        resolved[block] = sorted(set(resolved.get(block, [])) | set(chosen))
    return {b: resolved[b] for b in sites.blocks if b in resolved}


@contextmanager
def test_time_register(
    model: nn.Module | HookedModel, neurons: object, registers: int = 1, scale: float = 1.0,
    patches: str = "zero", image_size: tuple[int, int] | None = None,
) -> Iterator[TestTimeRegister]:  # fmt: skip
    """Within the context, every forward of ``model`` runs with ``registers`` extra tokens that
    take the register ``neurons``' activations (whole batch); the hooks are removed on exit,
    also after an exception.

    Args:
        model: a model whose blocks hold one flat token stream (ViT, DeiT, DINOv2, CLIP,
            SigLIP, CaiT's self-attention stage), of any library vizkit covers.
        neurons: `RegisterNeurons` (vk.registers.register_neurons) or {block: [neuron indices]}.
        registers: extra tokens, >= 1 (the paper uses 1).
        scale: multiplies the extreme activation the registers get (the paper: 1).
        patches: what the patches' activations of the neurons become: "zero", "mean", "keep".
        image_size: (H, W) of the images (the prefix tokens and the position check are read
            at it); default the model's own input size.

    On entry (once per model and image size), one random image runs with the extra tokens at
    the end and, again, right after the prefix tokens, in float32 on the CPU (on a copy where
    the model is elsewhere or in lower precision): a model whose attention ignores token order
    gives the same output both times; one whose attention depends on each token's position (a
    relative position bias, rotary embeddings, e.g. transformers' DINOv3, which counts its
    patches from the end) gives another output or fails, and is refused.

    Inside the context the model's output is the registered model's (predictions, embeddings,
    faithfulness curves and Grad-CAM on the output see it); maps of the inner stream hold the
    extra tokens, so read them with `vk.registers.register_effect`.

    Raises:
        ValueError / TypeError: a model without a flat, position-free token stream, bad
            neurons or options.
    """
    hm = as_hooked(model)
    registers = check_count("registers", registers)
    patches = check_choice("patches", patches, PATCH_VALUES)
    if not (isinstance(scale, int | float) and torch.isfinite(torch.tensor(float(scale)))):
        raise ValueError(f"scale must be a finite number; got {scale!r}.")
    image_size = tuple(image_size or model_preprocessing(hm.model).input_size[-2:])
    sites = register_sites(hm, image_size)
    state = TestTimeRegister(sites, resolve_neurons(sites, neurons), registers)
    _check_position_free(hm, sites, image_size, registers)
    handles = _extra_tokens(hm.model, state, at_end=True)
    try:
        for block, indices in state.neurons.items():
            linear = hm.model.get_submodule(sites.linears[sites.blocks.index(block)])
            edit = _neuron_edit(torch.tensor(indices), state, float(scale), patches)
            handles.append(linear.register_forward_pre_hook(edit))
        yield state
    finally:
        for handle in handles:
            handle.remove()


def _index(layer: object, value: object) -> int:
    """``value`` as a neuron index (any integer type, not a bool)."""
    if isinstance(value, bool):
        raise TypeError(f"neurons[{layer!r}] holds {value!r}; neuron indices are ints.")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"neurons[{layer!r}] holds {value!r}; neuron indices are ints.") from None


def _extra_tokens(model: nn.Module, state: TestTimeRegister, at_end: bool) -> list:
    """Hooks adding ``state.registers`` zero tokens to the stream entering the run (at the end,
    or right after the prefix tokens) and dropping them where it leaves."""
    sites, at = state.sites, None if at_end else state.sites.prefix_tokens
    entry, leave = model.get_submodule(sites.entry.module), model.get_submodule(sites.exit.module)
    handles = sites.entry.read.attach(entry, lambda x: _appended(x, state, at))
    try:
        handles += sites.exit.read.attach(leave, lambda x: _dropped(x, state, at))
    except Exception:
        for handle in handles:
            handle.remove()
        raise
    return handles


# models found position-free: model -> {(image size, registers)}
_POSITION_FREE: weakref.WeakKeyDictionary[nn.Module, set] = weakref.WeakKeyDictionary()


def _check_position_free(
    hm: HookedModel, sites: RegisterSites, image_size: tuple[int, int], registers: int
) -> None:  # fmt: skip
    """Refuse a model whose output depends on where the extra tokens sit in the stream: one
    random image, plain (its errors are the model's own), then with the tokens at the end and
    right after the prefix tokens. Run in float32 on the CPU (a copy of a model held elsewhere
    or in lower precision, whose rounding would blur the comparison); once per model."""
    key = (tuple(image_size), registers)
    if key in _POSITION_FREE.get(hm.model, ()):
        return
    model = _float32_on_cpu(hm.model)
    convs = (m.in_channels for m in model.modules() if isinstance(m, nn.Conv2d))
    channels = next(convs, model_preprocessing(hm.model).input_size[0])  # the patch embedding's
    x = torch.randn(1, channels, *image_size, generator=torch.Generator().manual_seed(0))
    outputs = []
    with torch.no_grad(), held(model):
        plain = embedding_of(model_logits(model(x))).float()
        for at_end in (True, False):
            state = TestTimeRegister(sites, {}, registers)
            handles = _extra_tokens(model, state, at_end)
            try:
                outputs.append(embedding_of(model_logits(model(x))).float())
            except RuntimeError as error:
                raise ValueError(_positional(hm, str(error).split("\n")[0])) from error
            except TypeError as error:
                if "positional inputs" not in str(error):
                    raise
                raise ValueError(
                    f"{sites.blocks[0]} takes its stream as a keyword argument, so vizkit cannot "
                    "add a token to it; test-time registers need blocks called with the stream "
                    "as their first positional input."
                ) from error
            finally:
                for handle in handles:
                    handle.remove()
    gap = (outputs[0] - outputs[1]).abs().max().item()
    if gap > 1e-4 * max(plain.abs().max().item(), 1.0):
        raise ValueError(_positional(hm, f"the output moved by {gap:.3g} with the tokens"))
    _POSITION_FREE.setdefault(hm.model, set()).add(key)


def _float32_on_cpu(model: nn.Module) -> nn.Module:
    """``model`` itself where it is on the CPU in float32, else a float32 CPU copy."""
    if all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters()):
        return model
    return copy.deepcopy(model).to("cpu", torch.float32)


def _positional(hm: HookedModel, why: str) -> str:
    return (
        f"The {hm.family.family} family's attention depends on where a token sits in the stream "
        "(a relative position bias, rotary embeddings) or its blocks reshape the tokens, so an "
        f"extra token has no place there ({why}); test-time registers need position-free "
        "attention over one flat stream (ViT, DeiT, DINOv2, CLIP, SigLIP)."
    )


def _appended(x: Tensor, state: TestTimeRegister, at: int | None) -> Tensor:
    """(B, N, C) -> (B, N + R, C): R zero tokens at the end (``at`` None) or at index ``at``."""
    state._entered.append(x.shape[1])
    state.tokens = x.shape[1] + state.registers
    zeros = x.new_zeros(len(x), state.registers, x.shape[-1])
    if at is None:
        return torch.cat([x, zeros], dim=1)
    return torch.cat([x[:, :at], zeros, x[:, at:]], dim=1)


def _dropped(x: Tensor, state: TestTimeRegister, at: int | None) -> Tensor:
    """(B, N + R, C) -> (B, N, C), keeping the registers' stream."""
    if not state._entered:
        raise RuntimeError("The register left the blocks without entering them.")
    tokens = state._entered.pop()
    if x.shape[1] != tokens + state.registers:
        raise ValueError(
            f"The stream leaving {state.sites.blocks[-1]} holds {x.shape[1]} tokens, not the "
            f"{tokens} + {state.registers} that entered: the blocks change the token count."
        )
    start = tokens if at is None else at
    state.stream = x[:, start : start + state.registers].detach()
    return torch.cat([x[:, :start], x[:, start + state.registers :]], dim=1)


def _neuron_edit(indices: Tensor, state: TestTimeRegister, scale: float, patches: str):
    """A pre-hook on a block's MLP projection moving ``indices``' activations (B, N + R, J)
    onto the registers."""
    prefix, registers = state.sites.prefix_tokens, state.registers

    def edit(module: nn.Module, args: tuple) -> tuple:
        if len(args) != 1:
            raise ValueError(
                f"{type(module).__name__} was called with {len(args)} positional inputs, not its "
                "hidden units alone, so its neurons cannot be moved."
            )
        (hidden,) = args
        if state.tokens is None or hidden.shape[-2] != state.tokens:
            raise ValueError(
                f"{type(module).__name__} read {tuple(hidden.shape)}, not the "
                f"{state.tokens} tokens of the registered stream: its block reshapes tokens."
            )
        index = indices.to(hidden.device)
        chosen = hidden[..., index]  # (B, N + R, k)
        flat = chosen.flatten(1)
        high, low = flat.amax(1), flat.amin(1)
        extreme = torch.where(high.abs() > low.abs(), high, low)  # (B,) the reference's sign_max
        edited = chosen.clone()
        edited[:, -registers:] = scale * extreme[:, None, None]
        image = slice(prefix, hidden.shape[-2] - registers)
        if patches == "zero":
            edited[:, image] = 0
        elif patches == "mean":
            edited[:, image] = chosen[:, image].mean(1, keepdim=True)
        out = hidden.clone()
        out[..., index] = edited
        return (out,)

    return edit
