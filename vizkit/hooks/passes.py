"""How many images one pass of a method that runs many copies of a batch may hold (noise
samples, interpolation steps, masked or ablated copies): a budget in bytes, ``max_bytes``, over
what one image's pass holds, measured. Never a count of copies, which multiplies with the batch.

A pass holds, per image, the copy it runs (the noisy, interpolated or masked image, which the
method makes) and what the model holds on it. ``max_bytes=None`` (every such method's default)
sizes the passes so that both together hold what a pass of the batch itself holds
(`vizkit.saliency`'s memory for a gradient method, a forward's for a forward-only one): a few
images fewer than the batch, so the batch size stays the one memory knob. On CUDA the passes
hold at least `CUDA_PASS_BYTES` (a pass of one image leaves a GPU idle) and at most 90 % of
the memory free on the device.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .gradient_graph import frozen_parameters
from .inputs import check_count

__all__ = ["available_bytes", "images_per_pass", "one_image_bytes", "peak_bytes"]

CUDA_PASS_BYTES = 2**28  # 256 MiB: 34 ViT-B/16 images' forward, 3 images' forward + backward
FREE_SHARE = 0.9  # of the CUDA memory free (and cached by torch, unused) that passes may take


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages the operators it sees allocate (not views of their
    inputs), as long as they live; ``peak``: the most held at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.held: dict[int, int] = {}

    def _freed(self, key: int) -> None:
        self.live -= self.held.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_key(t) for t in _tensors((args, kwargs))}
        for tensor in _tensors(out):
            key = _storage_key(tensor)
            if key and key not in self.held and key not in inputs:
                storage = tensor.untyped_storage()
                self.held[key] = storage.nbytes()
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._freed, key)
        return out


def _tensors(tree: object) -> list[Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, Tensor)]


def _storage_key(tensor: Tensor) -> int:
    """The address of ``tensor``'s storage; 0 for tensors without a plain one (sparse tensors,
    wrapper subclasses such as quantized weights), which are not counted."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return 0


def peak_bytes(run: Callable[[], object]) -> int:
    """The most bytes of tensors ``run()`` held allocated at once, beyond what existed before
    it (on any device; a kernel's private workspace is not a tensor and not counted)."""
    with _LiveBytes() as live:
        run()
    return live.peak


def one_image_bytes(model: torch.nn.Module, x: Tensor, gradients: bool) -> int:
    """The peak bytes of one image's pass: the image's copy (C, H, W) and ``model`` on it (the
    first image of ``x`` (B, C, H, W)), with ``gradients`` also the backward of the sum of its
    output tensors to the image (what a gradient method's pass holds per image), parameters
    frozen as the methods freeze them. Parameters' ``.grad`` and ``requires_grad`` are left as
    they were."""
    image = x[:1].detach().clone().requires_grad_(gradients)

    def run() -> None:
        if not gradients:
            with torch.no_grad():
                model(image)
            return
        with torch.enable_grad():  # also inside the caller's no_grad
            outputs = [t for t in _tensors(model(image)) if t.is_floating_point() and t.grad_fn]
            torch.autograd.grad(sum(t.float().sum() for t in outputs), image)

    with frozen_parameters(model):
        return peak_bytes(run) + image.nbytes


def images_per_pass(
    model: torch.nn.Module, x: Tensor, max_bytes: int | None, gradients: bool, method: str
) -> int:
    """Images (copies) one pass of ``method`` may hold for the batch x (B, C, H, W): as many as
    ``max_bytes`` allows at `one_image_bytes` each, or for None as many as fit in what a pass
    of the batch itself holds (at least one; on CUDA at least `CUDA_PASS_BYTES` worth); on CUDA
    within `FREE_SHARE` of the free memory.

    Raises:
        ValueError: not even one image's pass fits (the message gives its size and the fix).
    """
    available = available_bytes(x.device)
    if max_bytes is not None:
        max_bytes = check_count("max_bytes", max_bytes)
    per_image = one_image_bytes(model, x, gradients)
    if max_bytes is None:
        own = len(x) * (per_image - x[0].nbytes)  # the batch's own pass: no copies
        budget = own if available is None else max(own, CUDA_PASS_BYTES)
    else:
        budget = max_bytes
    if available is not None:
        budget = min(budget, int(FREE_SHARE * available))
    if budget >= per_image:
        return budget // per_image
    if max_bytes is None and available is None:
        return 1  # a batch of one image: its copy beside its own pass
    needed = f"One image's pass of {method} holds {per_image / 2**20:.1f} MiB"
    if budget == max_bytes:
        raise ValueError(
            f"{needed}, more than max_bytes={max_bytes}. Pass max_bytes={per_image} or more, or "
            "smaller images."
        )
    raise ValueError(
        f"{needed}, more than the {budget / 2**20:.1f} MiB free on {x.device}. Free device "
        "memory (delete tensors you no longer need, then torch.cuda.empty_cache()), or pass "
        "smaller images."
    )


def available_bytes(device: torch.device) -> int | None:
    """Bytes a pass can take on a CUDA ``device``: free, plus what torch caches unused; None
    on other devices (the CPU's memory is the operating system's to share)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
