"""HookedModel: canonical names, temporary hooks and activation caching for any model."""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .adapters import build_taps
from .attention_mode import unfused_attention
from .beside import PATTERN_PATHS, beside_is_faster
from .cache import ActivationCache
from .family import family_layout
from .guard import exclusive, tracking_forward
from .inputs import (
    DEFAULT_MAX_BYTES,
    check_choice,
    check_count,
    check_device,
    check_images,
    unwrap_model,
)
from .layout import TokenLayout, token_layout
from .names import (
    NameSpec,
    explicit_names,
    resolve_names,
    resolve_negative_indices,
    unknown_name_error,
)
from .taps import Tap
from .targets import Target, class_indices, target_score

__all__ = ["HookedModel", "HookFn", "frozen_parameters"]

HookFn = Callable[..., Tensor | None]  # fn(tensor, *, name) -> replacement or None


@dataclass
class _Run:
    """What one context attaches and what it has seen."""

    fwd: dict[str, list[HookFn]] = field(default_factory=dict)
    bwd: dict[str, list[HookFn]] = field(default_factory=dict)
    record: set[str] = field(default_factory=set)  # names to cache
    keep_for_grad: set[str] = field(default_factory=set)
    device: torch.device | str | None = None
    values: dict[str, Tensor] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    used: dict[str, Tensor] = field(default_factory=dict)  # the tensors the forward went on with
    views: dict[str, torch.Size] = field(default_factory=dict)  # names whose base is in `used`
    fired: Counter = field(default_factory=Counter)
    explicit: set[str] = field(default_factory=set)  # names asked for literally, not by pattern
    non_tensor: set[str] = field(default_factory=set)  # pattern matches that gave no tensor
    graph_starts: list[Tensor] = field(default_factory=list)  # activations made to require grad
    start_graph: bool = False  # run_with_cache differentiates: a tap starts the graph
    max_bytes: int | None = None  # the cache's limit (run_with_cache)
    unchanged: dict[str, tuple[Tensor, int]] = field(default_factory=dict)  # maps, versions
    held_bytes: int = 0  # what the cache holds so far, gradients to come counted
    dtype: torch.dtype | None = None  # cast cached values to it
    read_only: bool = False  # no hook may replace a value; maps may be computed beside
    pattern_path: str = "unfused"  # how maps are made (`vizkit.hooks.beside.PATTERN_PATHS`)

    def names(self) -> set[str]:
        return set(self.fwd) | set(self.bwd) | self.record


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
        self._class_token = _has_class_token(model)
        self._warned_training = False

    def __repr__(self) -> str:
        return f"HookedModel({type(self.model).__name__}, {len(self._names)} hook names)"

    def __call__(self, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        """The model's output on ``x`` (checked by `vizkit.hooks.inputs.check_images`)."""
        with exclusive(self.model):
            return self.model(check_images(self.model, x), *args, **kwargs)

    def hook_names(self) -> list[str]:
        """Canonical names of this model, in module order (see `vizkit.hooks.adapters`)."""
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
        fwd: Mapping[NameSpec, HookFn | list[HookFn]] | None = None,
        bwd: Mapping[NameSpec, HookFn | list[HookFn]] | None = None,
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
        explicit = set().union(*(explicit_names(spec, self._names) for spec in fwd or {}))
        run = _Run(
            fwd=self._expand(fwd),
            bwd=self._expand(bwd),
            explicit=explicit,
            read_only=read_only,
            pattern_path="auto" if read_only and not bwd else "unfused",  # bwd: maps on the path
        )
        self._refuse_derived_gradients(run.bwd, "hook the module's input or output instead")
        with self._attached(run):
            yield self
        _require_fired(list(run.fwd), run.fired, explicit, run.non_tensor)

    def run_with_cache(
        self,
        x: Tensor,
        names: NameSpec,
        *,
        grads: bool = False,
        target: Target = None,
        device: torch.device | str | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        bwd: Mapping[NameSpec, HookFn | list[HookFn]] | None = None,
        dtype: torch.dtype | None = None,
        pattern_path: str = "auto",
        **forward_kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        """Run the model on ``x`` and cache the named activations.

        Args:
            x: image batch (B, C, H, W).
            names: exact name, glob, compiled regex, callable or list (required: nothing is
                cached by default; attention of ViT-B/16 is 22 MB per image).
            grads: also cache ``<name>_grad``, the gradient of the target score with respect
                to each activation. Only what that gradient crosses is recorded: the forward
                runs without autograd up to the earliest of the named activations, where the
                graph starts, and parameters do not require grad during the call (their
                ``requires_grad`` and ``.grad`` are as before afterwards, also after an error).
            target: with ``grads`` or ``bwd``: a class index, B indices, a callable on the
                output, or None for each sample's argmax.
            device: move cached tensors there (e.g. ``"cpu"``); default: where they were made.
            max_bytes: refuse, during the forward, once the cache (with ``grads``: the
                activations and their gradients) would hold more than this (default 4 GiB).
            bwd: name, glob or regex -> ``fn(gradient, *, name)``: the target score is
                differentiated (recorded as with ``grads``) and each function sees its
                activation's gradient when the backward reaches it, so gradients can be used
                one at a time instead of cached together.
            dtype: cast cached values (and gradients) to it, e.g. ``torch.float16`` to halve
                the memory of attention maps; default: the dtype they were computed in
                (attention maps under CUDA autocast: float32, as it runs softmax in float32; a
                half-precision model's maps without autocast: its dtype).
            pattern_path: how attention maps (``hook_pattern``) of fused attention modules are
                made. "unfused": the module runs its explicit path for the call and the output
                is computed through the map. "beside": the fused kernel computes the output and
                the map is computed beside it from the same normalized queries and keys (equal
                to the unfused map; for timm's ``Attention``: ViT, DeiT, DINOv2...; other
                modules run unfused); not with gradients. "auto" (default): "beside" for a
                read-only run on a GPU in half precision, where it is faster, else "unfused"
                (`vizkit.hooks.beside.beside_is_faster`).

        Returns:
            (model output, ActivationCache in forward order). With ``grads`` the output is
            detached.

        Raises:
            KeyError: a name or pattern matches nothing.
            RuntimeError: a requested hook did not fire.
            ValueError: wrong input shape, a target out of range, or a cache above
                ``max_bytes`` (the message gives its size and how to shrink it).
        """
        x = check_images(self.model, x)
        max_bytes = check_count("max_bytes", max_bytes)
        device = None if device is None else check_device(device)
        check_choice("pattern_path", pattern_path, PATTERN_PATHS)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype or None; got {dtype!r}.")
        backward = grads or bool(bwd)
        if backward and pattern_path == "beside":
            raise ValueError(
                "pattern_path='beside' computes maps off the output's path, so they have no "
                "gradient; use pattern_path='auto' or 'unfused' with grads=True or bwd=."
            )
        if target is not None and not backward:
            raise ValueError(
                "target= chooses the score to differentiate; pass grads=True (or bwd=) with it."
            )
        if backward and target is not None and not callable(target):
            class_indices(target, len(x))  # types and count, before the forward
        chosen = resolve_names(names, self._names)
        explicit = explicit_names(names, self._names)
        run = _Run(
            bwd=self._expand(bwd),
            record=set(chosen),
            keep_for_grad=set(chosen) if grads else set(),
            start_graph=backward,
            device=device,
            max_bytes=max_bytes,
            explicit=explicit,
            dtype=dtype,
            read_only=not backward,
            pattern_path="unfused" if backward else pattern_path,
        )
        self._refuse_derived_gradients(
            [*(chosen if grads else ()), *run.bwd], "leave them out of names= (grads=True) and bwd="
        )
        if backward and torch.is_inference_mode_enabled():
            raise RuntimeError(
                "Gradients cannot be taken inside torch.inference_mode(); call this outside it."
            )
        if backward:
            x = x.detach().clone() if x.is_inference() else x.detach()
        recording = _recording_from_taps(self.model) if backward else nullcontext()
        with self._attached(run), recording:
            try:
                output = self.model(x, **forward_kwargs)
                chosen = _require_fired(chosen, run.fired, explicit, run.non_tensor)
                self._check_captures(run)
                grad_values = self._gradients(run, chosen, output, target) if backward else {}
            finally:
                for start in run.graph_starts:
                    start.requires_grad_(False)
        data: dict[str, Tensor] = {}
        for name in run.values:
            data[name] = run.values[name]
            if name in grad_values:
                data[f"{name}_grad"] = grad_values[name]
        output = output.detach() if backward and isinstance(output, Tensor) else output
        return output, ActivationCache(data, self._names, self.token_layout(tuple(x.shape[-2:])))

    # -- internals -------------------------------------------------------------------------

    def _expand(self, hooks: Mapping[NameSpec, HookFn | list[HookFn]] | None) -> dict[str, list]:
        expanded: dict[str, list[HookFn]] = {}
        for spec, fns in (hooks or {}).items():
            fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
            if not all(callable(f) for f in fns):
                raise TypeError(
                    f"Hook for {spec!r} must be a callable fn(tensor, *, name); got {fns!r}."
                )
            for name in resolve_names(spec, self._names):
                expanded.setdefault(name, []).extend(fns)
        return expanded

    @contextmanager
    def _attached(self, run: _Run) -> Iterator[None]:
        wanted = run.names()
        taps = [self._taps[n] for n in self._names if n in wanted]
        counters: Counter = Counter()
        with exclusive(self.model), ExitStack() as stack:
            training = [(m, m.training) for m in self.model.modules()]  # once the model is ours
            self._warn_if_random()
            try:
                stack.enter_context(tracking_forward(self.model))
                beside = self._maps_beside(run)
                unfuse = {self._modules[t.unfuse] for t in taps if t.unfuse and not beside(t)}
                stack.enter_context(unfused_attention(unfuse))
                for tap in taps:
                    if tap.explicit is not None:
                        stack.enter_context(tap.explicit())
                for tap in taps:
                    for handle in self._register(tap, run, counters, beside(tap)):
                        stack.callback(handle.remove)
                    if tap.call is not None:
                        reset = _reset_counter(counters, tap.name)
                        scope = self._modules[tap.call_scope]
                        stack.callback(scope.register_forward_pre_hook(reset).remove)
                yield
            finally:
                for module, mode in training:
                    module.training = mode

    def _maps_beside(self, run: _Run) -> Callable[[Tap], bool]:
        """Whether a tap's map is computed beside its fused kernel in this run."""
        path = run.pattern_path  # "unfused" for every run that differentiates or edits
        on = path == "beside" or (path == "auto" and beside_is_faster(self.model))
        return lambda tap: on and tap.beside is not None

    def _register(self, tap: Tap, run: _Run, counters: Counter, beside: bool) -> list:
        """The hook handles that read ``tap`` in this run."""
        module = self._modules[tap.module]

        if beside:

            def on_map(pattern: Tensor) -> None:
                self._visit(tap, run, pattern, readonly=True)

            return tap.beside(on_map)

        if tap.compute is not None:

            def derived_hook(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
                self._visit(tap, run, tap.compute(mod, args, kwargs, output), readonly=True)

            return [module.register_forward_hook(derived_hook, with_kwargs=True)]

        def selected() -> bool:
            if tap.call is None:
                return True
            counters[tap.name] += 1
            return counters[tap.name] - 1 == tap.call

        starts = []
        wants_grad = tap.name in run.keep_for_grad or tap.name in run.bwd
        if tap.read_only and run.start_graph and wants_grad:  # handed on after its use:

            def start_at_input(mod: nn.Module, args: tuple, kwargs: dict) -> None:
                """record from the module's input, so the value is on the output's path."""
                first = next(
                    (v for v in (*args, *kwargs.values())
                     if isinstance(v, Tensor) and v.is_floating_point()),
                    None,
                )  # fmt: skip
                if first is not None and not first.requires_grad:
                    self._start_graph(tap, run, first)

            starts = [module.register_forward_pre_hook(start_at_input, with_kwargs=True)]

        if tap.site == "output":

            def forward_hook(mod: nn.Module, args: tuple, output: Any) -> Any:
                if not selected():
                    return None
                raw = output if tap.item is None else output[tap.item]
                used = self._visit(tap, run, raw)
                if used is raw:
                    return None
                if tap.item is None:
                    return used
                items = list(output)
                items[tap.item] = used
                return type(output)(*items) if hasattr(output, "_fields") else type(output)(items)

            return [*starts, module.register_forward_hook(forward_hook)]

        def pre_hook(mod: nn.Module, args: tuple) -> tuple | None:
            if not selected():
                return None
            if len(args) <= tap.arg:
                raise TypeError(
                    f"{tap.name}: {tap.module} was called with {len(args)} positional "
                    f"inputs; vizkit reads positional input {tap.arg}."
                )
            used = self._visit(tap, run, args[tap.arg])
            return None if used is args[tap.arg] else (*args[: tap.arg], used, *args[tap.arg + 1 :])

        return [module.register_forward_pre_hook(pre_hook)]

    def _visit(self, tap: Tap, run: _Run, raw: Any, readonly: bool = False) -> Tensor:
        """Run the user's functions on one activation and record it; return the tensor to use.
        ``readonly``: a derived value, which no hook may replace."""
        if not isinstance(raw, Tensor):
            if tap.name not in run.explicit and tap.name.endswith(".hook_out"):
                run.non_tensor.add(tap.name)  # matched by a pattern: skipped, not fired
                return raw
            raise TypeError(
                f"{tap.name}: module {tap.module!r} gave a {type(raw).__name__}, not a "
                "tensor; vizkit hooks tensors only. Hook a submodule instead."
            )
        value = canonical = tap.to_canonical(raw)
        fixed = readonly or tap.read_only  # no replacement can change what the model computes
        for fn in run.fwd.get(tap.name, ()):
            new = fn(value, name=tap.name)
            if new is not None and (fixed or run.read_only):
                if isinstance(new, Tensor) and torch.equal(new, value):
                    continue  # an unchanged copy edits nothing
                raise ValueError(_edit_refused(tap, derived=fixed and not run.read_only))
            if new is not None:
                _check_replacement(tap.name, new, value)
                value = new
        used = raw if value is canonical else tap.from_canonical(value, raw)
        run.fired[tap.name] += 1
        if tap.name in run.record:
            self._count_bytes(tap.name, run, value)
            kept = value.detach()
            kept = kept.clone() if tap.name.endswith(".hook_out") else kept  # see _check_fired
            run.values[tap.name] = kept.to(run.device, run.dtype)
            if not kept.is_inference():  # inference tensors have no version counter
                run.versions[tap.name] = kept._version
        wants_grad = tap.name in run.keep_for_grad or tap.name in run.bwd
        if run.start_graph and wants_grad and not used.requires_grad:
            self._start_graph(tap, run, used)
        # a value handed on as a view of the tensor the module used (torch's attention weights,
        # (B·H, L, S) viewed as (B, H, L, S)): its gradient is the base's, viewed
        on_path = used._base if tap.read_only and used._base is not None else used
        if tap.name in run.keep_for_grad:
            run.used[tap.name] = on_path
            if on_path is not used:
                run.views[tap.name] = used.shape
        if not used.requires_grad or (
            tap.name not in run.keep_for_grad and tap.name not in run.bwd
        ):
            return used
        for fn in run.bwd.get(tap.name, ()):
            on_path.register_hook(_gradient_hook(fn, tap, used.shape))
        if tap.kind:  # an attention map (B·H·N² floats): the forward goes on with it, and an
            run.unchanged[tap.name] = (used, used._version)  # in-place change is refused after
            return used
        # The forward goes on with a copy, so a later in-place op (``x += shortcut``, ``relu_``)
        # rewrites the copy and the gradient read at ``used`` is that of the value as the model
        # used it, not of the rewritten tensor.
        return used.clone()

    def _refuse_derived_gradients(self, names, fix: str) -> None:
        derived = [n for n in names if self._taps[n].compute is not None]
        if derived:
            raise ValueError(
                f"{derived} are derived values (computed from a module's weights and input, not "
                f"tensors the forward passes on), so no gradient flows through them; {fix}."
            )

    def _count_bytes(self, name: str, run: _Run, value: Tensor) -> None:
        """Refuse before the cache grows past ``run.max_bytes`` (a gradient doubles a name)."""
        if run.max_bytes is None:
            return
        run.held_bytes += value.nbytes * (2 if name in run.keep_for_grad else 1)
        if run.held_bytes > run.max_bytes:
            what = "activations and gradients" if run.keep_for_grad else "activations"
            raise ValueError(
                f"The cache of {what} passed max_bytes={run.max_bytes / 2**20:.1f} MiB at {name} "
                f"({run.held_bytes / 2**20:.1f} MiB so far, {len(run.values) + 1} names). Ask "
                "for fewer names, a smaller batch or a larger max_bytes."
            )

    def _start_graph(self, tap: Tap, run: _Run, used: Tensor) -> None:
        """Start recording at ``used`` (`_recording_from_taps`): nothing before this activation
        is in the graph, everything after it is. The flag is set on the tensor itself, not a
        detached copy, so every later use of it (a residual branch beside the hooked module,
        too) carries the gradient; it is cleared after the call."""
        if isinstance(used, nn.Parameter) or any(used is b for b in self.model.buffers()):
            raise ValueError(
                f"{tap.name} is a parameter or buffer of the model, not an activation; take the "
                "gradient at an activation."
            )
        used.requires_grad_(True)
        run.graph_starts.append(used)
        torch.set_grad_enabled(True)

    def _warn_if_random(self) -> None:
        """Warn once if the model's training mode makes results random or updates buffers."""
        if self._warned_training or not self.model.training:
            return
        stochastic = training_effects(self.model)
        if stochastic:
            self._warned_training = True
            warnings.warn(
                f"{type(self.model).__name__} is in training mode, so {', '.join(stochastic)} "
                "act in this forward: activations and gradients are random or depend on the "
                "batch. Call model.eval() first, or use the vizkit analyses, which run the model "
                "in eval mode and restore its mode after.",
                stacklevel=5,
            )

    def _check_captures(self, run: _Run) -> None:
        """Warn about names that fired twice; raise if a capture was later changed in place."""
        for name, count in run.fired.items():
            if name in run.record and count > 1:
                warnings.warn(
                    f"{name} fired {count} times in one forward (a module called "
                    "several times); the cache holds the last call.",
                    stacklevel=3,
                )
        changed = [n for n, v in run.versions.items() if run.values[n]._version != v]
        changed += [n for n, (t, v) in run.unchanged.items() if t._version != v]
        if changed:
            raise RuntimeError(
                f"{changed} were modified in place after capture by a later "
                "module, so the cache would not hold what they were. (vizkit copies "
                "'.hook_out' captures; capture the module's .hook_out instead.)"
            )

    def _gradients(self, run: _Run, chosen: list[str], output: Any, target: Target) -> dict:
        with torch.enable_grad():
            score = target_score(output, target)
        chosen = [n for n in chosen if n in run.keep_for_grad]
        inputs = [run.used[n] for n in chosen] or run.graph_starts  # bwd only: run the backward
        if not score.requires_grad:
            raise RuntimeError(
                f"The target score does not depend on {chosen or sorted(run.bwd)} (values "
                "computed beside the output, not on its path), so they have no gradient."
            )
        grads = torch.autograd.grad(score, inputs, allow_unused=True)
        if not chosen:
            return {}
        result = {}
        for name, used, grad in zip(chosen, inputs, grads, strict=False):
            grad = torch.zeros_like(used) if grad is None else grad  # unused: the gradient is 0
            grad = grad.reshape(run.views[name]) if name in run.views else grad
            grad = self._taps[name].to_canonical(grad).detach()
            result[name] = grad.to(run.device, run.dtype)
        return result


@contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[None]:
    """Parameters do not require grad inside the block (no tensor is saved for their
    gradients); each one's ``requires_grad`` is restored on exit, also after an error."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in trainable:
            p.requires_grad_(False)
        yield
    finally:
        for p in trainable:
            p.requires_grad_(True)


@contextmanager
def _recording_from_taps(model: nn.Module) -> Iterator[None]:
    """Autograd off, and parameters frozen, for the call; a tap whose gradient is wanted
    switches recording on when it fires (`HookedModel._start_graph`), so the graph holds only
    the network between the earliest such activation and the output. Grad mode is restored on
    exit, also after an error."""
    with frozen_parameters(model), torch.no_grad():
        yield


def training_effects(model: nn.Module) -> list[str]:
    """What train mode changes in ``model``'s forward: active dropout or drop-path (random
    outputs) and BatchNorm (batch statistics, running statistics updated)."""
    kinds = {}
    for module in model.modules():
        if not module.training:
            continue
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            kinds["dropout"] = True
        elif getattr(module, "drop_prob", 0) > 0:  # timm DropPath, DropBlock
            kinds["drop-path"] = True
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            kinds["BatchNorm"] = True
    return list(kinds)


def _has_class_token(model: nn.Module) -> bool:
    """Whether the model learns a class token (``cls_token``; CrossViT: one per branch)."""
    return any(name.split(".")[-1].startswith("cls_token") for name, _ in model.named_parameters())


def _require_fired(
    chosen: list[str], fired: Counter, explicit: set[str], non_tensor: set[str] = frozenset()
) -> list[str]:
    """The chosen names that fired. Raise if a name asked for literally (or every name) did not
    fire; warn about pattern matches that did not (modules off this forward path, or modules
    whose output is a tuple or list: ``non_tensor``)."""
    silent = [n for n in chosen if not fired[n]]
    if silent and len(silent) == len(chosen) and set(silent) <= non_tensor:
        raise TypeError(
            f"{silent} gave tuples or lists, not tensors; vizkit hooks tensors only. Hook a "
            "submodule instead."
        )
    if silent and (explicit & set(silent) or len(silent) == len(chosen)):
        raise RuntimeError(
            f"Requested hooks did not fire: {silent}. Run the model inside the "
            "context; if you did, the forward path bypassed these modules (e.g. a "
            "pooling or head option that skips them)."
        )
    if silent:
        warnings.warn(
            f"{len(silent)} names matched by a pattern did not fire (their modules are "
            f"not on this forward path): {silent}",
            stacklevel=4,
        )
    return [n for n in chosen if fired[n]]


def _check_replacement(name: str, new: Any, value: Tensor) -> None:
    """Raise unless the hook's return ``new`` can stand in for ``value``: a tensor of its shape,
    dtype and device (the forward would fail deep inside torch, or silently change precision)."""
    if not isinstance(new, Tensor) or new.shape != value.shape:
        got = tuple(new.shape) if isinstance(new, Tensor) else type(new).__name__
        raise ValueError(
            f"The hook on {name} returned {got}; a replacement must be a tensor of "
            f"the activation's shape {tuple(value.shape)} (or None to keep it)."
        )
    if new.dtype != value.dtype or new.device != value.device:
        raise TypeError(
            f"The hook on {name} returned a {new.dtype} tensor on {new.device}; the activation "
            f"is {value.dtype} on {value.device}. Cast it back, e.g. .to({value.dtype}, "
            f"'{value.device}'), or return None to keep the activation."
        )


def _edit_refused(tap: Tap, derived: bool) -> str:
    """Why a hook may not replace ``tap``'s value: a derived value, or a read-only run."""
    if derived and tap.compute is None:
        return (
            f"The hook on {tap.name} returned a changed tensor, but {tap.module} returns "
            f"{tap.name} beside an output it has already computed from it, so the edit would "
            "change nothing; return None (read it), or edit the module's input or output instead."
        )
    if derived:
        return (
            f"The hook on {tap.name} returned a changed tensor, but {tap.name} is derived from "
            f"{tap.module}'s weights and input, not passed on by the forward, so the edit would "
            "change nothing; return None (read it), or edit the module's input or output instead."
        )
    return (
        f"The hook on {tap.name} returned a changed tensor in a read-only run "
        "(hooks(read_only=True)); return None, or open hooks() without read_only to edit."
    )


def _reset_counter(counters: Counter, name: str) -> Callable:
    def reset(module: nn.Module, args: tuple) -> None:
        counters[name] = 0

    return reset


def _gradient_hook(
    fn: HookFn, tap: Tap, shape: torch.Size | None = None
) -> Callable[[Tensor], Tensor | None]:
    """``fn`` on the gradient in ``tap``'s canonical layout (``shape``: the value's, where the
    gradient arrives at the base it is a view of)."""

    def hook(grad: Tensor) -> Tensor | None:
        raw = grad if shape is None else grad.reshape(shape)
        canonical = tap.to_canonical(raw)
        new = fn(canonical, name=tap.name)
        if new is None:
            return None
        _check_replacement(f"{tap.name} (backward)", new, canonical)
        return tap.from_canonical(new, raw).reshape(grad.shape)

    return hook
