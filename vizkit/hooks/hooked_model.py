"""HookedModel: canonical names, temporary hooks and activation caching for any model."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from .adapters import build_taps
from .beside import beside_is_faster
from .cache import ActivationCache
from .capture import Capture, require_fired
from .edits import edited
from .family import family_layout
from .gradient_graph import GradientGraph, recording_from_taps, refuse_derived_gradients
from .guard import exclusive, tracking_forward
from .inputs import DEFAULT_MAX_BYTES, check_images, unwrap_model
from .layout import TokenLayout, has_class_token, token_layout
from .names import NameSpec
from .readers import BesideReader, Reader
from .request import Hooks, Request
from .scores import Target
from .selector import resolve_negative_indices, unknown_name_error
from .taps import Tap
from .training_mode import warn_if_random
from .video import hook_call

__all__ = ["HookedModel"]


@dataclass
class _Run:
    """One call: what was asked, what it has seen, and the gradient graph it records."""

    request: Request
    capture: Capture = field(default_factory=Capture)
    graph: GradientGraph = field(default_factory=GradientGraph)


class HookedModel:
    """Wrap a model to read and edit its activations by canonical name.

    Nothing is attached at construction; hooks exist only inside `hooks` and `run_with_cache`,
    and on exit (also after an exception) every hook, ``fused_attn`` flag and training flag is as
    before. Attention patterns are captured with the model's fused attention left on: only the
    attention modules whose pattern is requested are switched to the explicit path, inside the
    context.

    Example:
        >>> import timm, torch
        >>> hm = HookedModel(timm.create_model("test_vit"))
        >>> x = torch.randn(2, 3, 64, 64)
        >>> logits, cache = hm.run_with_cache(x, names="blocks.*.attn.hook_pattern")
        >>> cache.stack("attn.hook_pattern").shape  # (L, B, H, N, N)
        torch.Size([6, 2, 2, 17, 17])
    """

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"HookedModel wraps a torch.nn.Module; got {type(model).__name__}.")
        self.model = model = unwrap_model(model)
        self.family = family_layout(model)  # None for families without an adapter
        self._taps = {tap.name: tap for tap in build_taps(model, self.family)}
        self._names = list(self._taps)
        self._modules = dict(model.named_modules())
        self._root = model.get_submodule(self.family.root) if self.family else model
        self._class_token = has_class_token(model)
        self._warned_training = False

    def __repr__(self) -> str:
        return f"HookedModel({type(self.model).__name__}, {len(self._names)} hook names)"

    def __call__(self, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        """The model's output on ``x`` (checked by `vizkit.hooks.inputs.check_images`)."""
        with exclusive(self.model):
            with hook_call("HookedModel"):
                x = check_images(self.model, x)
            return self.model(x, *args, **kwargs)

    def hook_names(self) -> list[str]:
        """Canonical names of this model, in module order (see `vizkit.hooks.adapters`; a
        block whose forward runs its children in another order than they were registered,
        TimeSformer's, lists them as they run)."""
        return list(self._names)

    def tap(self, name: str) -> Tap:
        """Where ``name`` is read from and its documented shape."""
        if not isinstance(name, str):
            raise TypeError(
                f"Expected a hook name such as 'blocks.3.hook_resid_pre' (hook_names() lists "
                f"them); got {name!r} ({type(name).__name__})."
            )
        resolved = resolve_negative_indices(name, self._names)
        if resolved not in self._taps:
            raise unknown_name_error(resolved, self._names)
        return self._taps[resolved]

    def token_layout(
        self, image_size: tuple[int, int], name: str | None = None
    ) -> TokenLayout | None:
        """Prefix tokens and patch grid for an (H, W) input; with ``name``, of that activation
        (CaiT's self-attention stage has no prefix tokens). None for models without patches."""
        layout = token_layout(self._root, image_size)  # checks image_size
        if self.family is not None and self.family.tokens is not None:
            layout = self.family.tokens(tuple(int(s) for s in image_size))
        tap = self.tap(name) if name is not None else None
        if tap is not None and tap.grid is not None:  # a stage of a hierarchical model
            grid = tuple(int(g) for g in tap.grid(tuple(image_size)))
            prefix = tap.prefix_tokens or 0
            return TokenLayout(prefix, grid, prefix > 0 and self._class_token)
        prefix = tap.prefix_tokens if tap is not None else None
        if layout is None or prefix is None:
            return layout
        return dataclasses.replace(
            layout, num_prefix_tokens=prefix, class_token=layout.class_token and prefix > 0
        )

    @contextmanager
    def hooks(
        self,
        fwd: Hooks | None = None,
        bwd: Hooks | None = None,
        *,
        read_only: bool = False,
    ) -> Iterator[HookedModel]:
        """Run hook functions on named activations while the context is open.

        Args:
            fwd: name, glob or regex -> ``fn(tensor, *, name) -> Tensor | None``; the tensor is in
                the canonical layout and a returned tensor of the same shape replaces it.
            bwd: the same for gradients flowing back into the activation (run the backward
                inside the context).
            read_only: the functions only read (one that returns a changed tensor raises), so
                attention maps may be computed beside the fused kernel where that is faster
                (``pattern_path="auto"`` of `run_with_cache`).

        Raises:
            RuntimeError: on exit, if a forward hook never fired.
        """
        run = _Run(Request.for_hooks(self._names, fwd, bwd, read_only))
        refuse_derived_gradients(
            run.request.bwd, self._taps, "hook the module's input or output instead"
        )
        with self._attached(run):
            yield self
        fired, request = run.capture, run.request
        require_fired(list(request.fwd), fired.fired, request.explicit, fired.non_tensor)

    def run_with_cache(
        self,
        x: Tensor,
        names: NameSpec,
        *,
        grads: bool = False,
        target: Target = None,
        device: torch.device | str | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        bwd: Hooks | None = None,
        dtype: torch.dtype | None = None,
        pattern_path: str = "auto",
        **forward_kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        """Run the model on ``x`` and cache the named activations.

        Args:
            x: image batch (B, C, H, W).
            names: a name, glob, regex, callable or list (required; ViT-B/16's maps: 22 MB/image).
            grads: also cache ``<name>_grad``, the gradient of the target score with respect
                to each activation. Only what that gradient crosses is recorded: the graph
                starts at the earliest named activation, and parameters do not require grad
                during the call (`vizkit.hooks.gradient_graph`; as before afterwards).
            target: with ``grads`` or ``bwd``: a class index, B indices, a callable on the
                output, or None for each sample's argmax.
            device: move cached tensors there (e.g. ``"cpu"``); default: where they were made.
            max_bytes: refuse, during the forward, once the cache (with ``grads``: and the
                gradients) would hold more than this (default 4 GiB).
            bwd: name, glob or regex -> ``fn(gradient, *, name)``: the target score is
                differentiated (recorded as with ``grads``) and each function sees its
                activation's gradient when the backward reaches it, so gradients can be used
                one at a time instead of cached together.
            dtype: cast cached values (and gradients) to it, e.g. ``torch.float16`` to halve
                the memory of attention maps; default: the dtype they were computed in.
            pattern_path: how the maps of fused attention modules are made: "unfused" (the
                explicit path runs for the call), "beside" (the fused kernel computes the
                output, the map is computed beside it from the same queries and keys; read
                only, timm's ``Attention``) or "auto" (default: "beside" where it is faster,
                `vizkit.hooks.beside.beside_is_faster`).

        Returns:
            (model output, detached with ``grads``; ActivationCache in forward order).

        Raises:
            KeyError: a name or pattern matches nothing.
            RuntimeError: a requested hook did not fire.
            ValueError: wrong input shape, a target out of range, or a cache above
                ``max_bytes`` (the message gives its size and how to shrink it).
        """
        with hook_call("run_with_cache"):
            x = check_images(self.model, x)
        request, chosen = Request.for_cache(
            self._names, names, len(x), grads=grads, target=target, device=device,
            max_bytes=max_bytes, bwd=bwd, dtype=dtype, pattern_path=pattern_path,
        )  # fmt: skip
        refuse_derived_gradients(
            [*(chosen if grads else ()), *request.bwd],
            self._taps,
            "leave them out of names= (grads=True) and bwd=",
        )
        return self._cached(x, _Run(request), chosen, target, forward_kwargs)

    # -- internals -------------------------------------------------------------------------

    def _cached(
        self, x: Tensor, run: _Run, chosen: list[str], target: Target, forward_kwargs: dict
    ) -> tuple[Any, ActivationCache]:
        """One forward of ``run_with_cache``'s request (and its backward, where it asks for
        one); the output and the cache of what was recorded."""
        request, capture, graph = run.request, run.capture, run.graph
        backward = request.start_graph
        if backward and torch.is_inference_mode_enabled():
            raise RuntimeError(
                "Gradients cannot be taken inside torch.inference_mode(); call this outside it."
            )
        if backward:
            x = x.detach().clone() if x.is_inference() else x.detach()
        recording = recording_from_taps(self.model) if backward else nullcontext()
        with self._attached(run), recording:
            try:
                output = self.model(x, **forward_kwargs)
                chosen = require_fired(chosen, capture.fired, request.explicit, capture.non_tensor)
                capture.check(request, graph.changed())
                gradients = (
                    graph.gradients(output, target, chosen, request, self._taps, len(x))
                    if backward
                    else {}
                )
            finally:
                graph.release()
        data: dict[str, Tensor] = {}
        for name, value in capture.values.items():
            data[name] = value
            if name in gradients:
                data[f"{name}_grad"] = gradients[name]
        output = output.detach() if backward and isinstance(output, Tensor) else output
        return output, ActivationCache(data, self._names, self.token_layout(tuple(x.shape[-2:])))

    @contextmanager
    def _attached(self, run: _Run) -> Iterator[None]:
        wanted = run.request.names()
        taps = [self._taps[n] for n in self._names if n in wanted]
        with exclusive(self.model), ExitStack() as stack:
            training = [(m, m.training) for m in self.model.modules()]  # once the model is ours
            if not self._warned_training:
                self._warned_training = warn_if_random(self.model)
            try:
                stack.enter_context(tracking_forward(self.model))
                readers = self._readers(taps, run)
                for reader in readers:
                    stack.enter_context(reader.switched())
                for tap, reader in zip(taps, readers, strict=True):
                    for handle in self._register(tap, reader, run):
                        stack.callback(handle.remove)
                yield
            finally:
                for module, mode in training:
                    module.training = mode

    def _readers(self, taps: list[Tap], run: _Run) -> list[Reader]:
        """How each tap is read in this run: its own reader, or where the run may compute maps
        beside their fused kernels (read only, and faster here), a `BesideReader`."""
        path = run.request.pattern_path  # "unfused" for every run that differentiates or edits
        on = path == "beside" or (path == "auto" and beside_is_faster(self.model))
        return [
            BesideReader(tap.read.beside) if on and tap.read.beside is not None else tap.read
            for tap in taps
        ]

    def _register(self, tap: Tap, reader: Reader, run: _Run) -> list[RemovableHandle]:
        """The hook handles that read ``tap`` in this run: where its gradient is wanted and the
        module hands it on after using it, the graph starts at the module's input first."""
        module = self._modules[tap.module]
        starts = []
        wanted = run.request.start_graph and run.request.wants_grad(tap.name)
        if reader.handed_on and wanted:
            starts = [run.graph.attach_start(tap, module, self.model)]
        return [*starts, *reader.attach(module, functools.partial(self._visit, tap, reader, run))]

    def _visit(self, tap: Tap, reader: Reader, run: _Run, raw: Any) -> Tensor:
        """One activation (the ``emit`` of ``tap``'s ``reader``): the request's functions run
        on it, it is recorded, and the tensor the forward goes on with is returned."""
        if not isinstance(raw, Tensor):
            return run.capture.not_a_tensor(tap, run.request, raw)
        value, used = edited(tap, reader, run.request, raw)
        run.capture.fired[tap.name] += 1
        if tap.name in run.request.record:
            run.capture.record(tap.name, value, run.request)
        return run.graph.hand_on(tap, reader, used, run.request, self.model)
