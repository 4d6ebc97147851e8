"""The input contract, in one place: the model (wrappers unwrapped), the image batch (rank,
channels, size, dtype, empty, NaN/Inf) and numeric options (range-checked).

Every analysis, metric and explorer applies these checks before any work, so a bad input gives
one clear error naming what was wrong, what is valid and how to fix it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .family import family_layout
from .layout import validate_input
from .video import VideoInput, check_video, require_video_analysis, running

DEFAULT_MAX_BYTES = 4 * 2**30  # what an analysis may hold before it refuses (4 GiB)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "check_choice",
    "check_count",
    "check_device",
    "check_image_batch",
    "check_image_pairs",
    "check_images",
    "check_indices",
    "check_maps",
    "check_number",
    "check_size",
    "check_values_finite",
    "model_device",
    "refuse_video_model",
    "unwrap_model",
    "video_input",
]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module that computes: ``torch.compile``'s ``_orig_mod``, ``DataParallel`` and
    ``DistributedDataParallel``'s ``.module`` (nested wrappers too). vizkit runs the unwrapped
    module on one device: hooks and compiled graphs do not mix."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"Expected a torch.nn.Module; got {type(model).__name__}.")
    while True:
        if isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile
            model = model._orig_mod
        elif isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        else:
            return model


def _floating_dtype(model: nn.Module) -> torch.dtype | None:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def _device(model: nn.Module) -> torch.device | None:
    parameter = next(model.parameters(), None)
    return None if parameter is None else parameter.device


def model_device(model: nn.Module) -> torch.device:
    """Where ``model`` computes: its first parameter's device (the CPU for a parameterless
    module)."""
    return _device(model) or torch.device("cpu")


def check_image_pairs(model: nn.Module, clean: Tensor, corrupted: Tensor) -> tuple[Tensor, Tensor]:
    """``clean`` and ``corrupted`` (B, C, H, W) as `check_images` gives them, refused unless
    they are pairs of the same shape (patching compares image b with its pair b)."""
    clean, corrupted = check_images(model, clean), check_images(model, corrupted)
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean and corrupted must be pairs of the same shape; got {tuple(clean.shape)} and "
            f"{tuple(corrupted.shape)}."
        )
    return clean, corrupted


def check_images(model: nn.Module, x: Tensor, first: int | None = None) -> Tensor:
    """``x`` as an image batch the model takes: on the model's device, in its floating dtype.

    Args:
        model: the (unwrapped) model.
        x: (B, C, H, W) floating images, B >= 1, every value finite.
        first: the data index of ``x[0]`` where ``x`` is a batch of a data set (non-finite
            images are then named by their data indices, not their places in the batch).

    Returns:
        ``x`` moved to the model's device and cast to its parameters' floating dtype (a float64
        or float16 batch into a float32 model is cast, as ``model.to(dtype)`` users expect).

    Raises:
        TypeError: not a tensor, or integer / bool / complex images (not normalized).
        ValueError: wrong rank, channels or size (see `validate_input`), an empty batch, or
            NaN / Inf values (the samples are named).
    """
    model = unwrap_model(model)
    check_image_batch(model, x)
    check_values_finite("images", x, first)  # where the images are: no GPU sync for host images
    dtype, device = _floating_dtype(model), _device(model)
    cast = x.to(device=device or x.device, dtype=dtype or x.dtype)
    if cast.dtype != x.dtype and not bool(torch.isfinite(cast).all()):
        raise ValueError(
            f"The {x.dtype} images overflow the model's {cast.dtype} (largest magnitude "
            f"{x.abs().max().item():.3g}); normalize them as the model was trained."
        )
    return cast


def check_image_batch(model: nn.Module, x: Tensor) -> None:
    """The checks of `check_images` that read no values: type, dtype, rank, channels, size,
    an empty or meta batch. Cheap for any batch size, so an analysis can refuse an oversized
    capture before `check_images` scans every value."""
    if not isinstance(x, Tensor):
        hint = " Convert with torch.from_numpy(x)." if type(x).__module__ == "numpy" else ""
        raise TypeError(
            f"Expected an image batch tensor (B, C, H, W); got {type(x).__name__}.{hint}"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"Expected floating-point images normalized as the model was trained; got dtype "
            f"{x.dtype}. vk.datasets.load_images(images, model) resizes and normalizes files, "
            "PIL images and uint8 arrays or tensors for the model."
        )
    model = unwrap_model(model)
    video = video_input(model)
    if video is not None:
        require_video_analysis(type(model).__name__)
        check_video(type(model).__name__, video, x)
    else:
        validate_input(model, x)
    if len(x) == 0:
        raise ValueError(f"The image batch is empty (shape {tuple(x.shape)}); pass B >= 1 images.")
    if x.is_meta:
        raise ValueError("The images are meta tensors (no data); pass real images.")


def video_input(model: nn.Module) -> VideoInput | None:
    """The clips a video ``model`` takes (its family's `VideoInput`); None for a model of
    images."""
    layout = family_layout(unwrap_model(model))
    return None if layout is None else layout.video


def refuse_video_model(model: nn.Module, analysis: str) -> None:
    """Refuse a video ``model`` for ``analysis``, which does not take videos yet and reads its
    data before any image check (the activation store)."""
    if video_input(model) is not None:
        with running(analysis, videos=False):
            require_video_analysis(type(model).__name__)


def check_device(device: object) -> torch.device:
    """``device`` as a torch.device that exists on this machine; a ValueError listing the devices
    that do otherwise."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{device!r} is not a device; use e.g. 'cpu' or 'cuda:0'.") from None
    available = ["cpu"]
    for kind in ("cuda", "mps", "xpu"):
        backend = getattr(torch, kind, None)
        if backend is not None and backend.is_available():
            count = backend.device_count() if hasattr(backend, "device_count") else 1
            available += [kind, *(f"{kind}:{i}" for i in range(count))]
    index = 0 if device.index is None else device.index
    exists = device.type in ("cpu", "meta") or f"{device.type}:{index}" in available
    if not exists:
        raise ValueError(f"Device {str(device)!r} does not exist here; available: {available}.")
    return device


def check_maps(
    what: str, value: object, axes: str = "(B, h, w)", variable: str = "maps", ndim: int = 3
) -> Tensor:
    """``value`` as a non-empty real tensor of one map per image, ``axes`` (B, h, w), or with
    ``ndim`` 4 one per clip (B, T, h, w); a TypeError/ValueError naming ``what`` ("saliency
    maps", "masks") and the fix, written for the argument ``variable``, otherwise."""
    if not isinstance(value, Tensor):
        raise TypeError(
            f"Expected {what} as a tensor {axes}; got {type(value).__name__}. Convert arrays "
            "with torch.from_numpy."
        )
    if value.is_complex():
        raise TypeError(f"{what} must be real; got dtype {value.dtype}. Pass .abs().")
    if value.ndim != ndim:
        hint = (
            {}
            if ndim != 3
            else {
                2: f" A 2-D tensor is one map: if it is one image's (h, w), add the batch axis "
                f"({variable}[None]); B images need one full map each, (B, h, w).",
                4: f" Drop the channel axis: {variable}[:, 0].",
            }
        )
        raise ValueError(
            f"Expected {what} of shape {axes}; got {tuple(value.shape)}." + hint.get(value.ndim, "")
        )
    if len(value) == 0:
        raise ValueError(f"The {what} are empty (shape {tuple(value.shape)}); pass B >= 1.")
    return value


def check_values_finite(what: str, values: Tensor, first: int | None = None) -> None:
    """Raise a ValueError naming the samples (first axis) of ``values`` that hold NaN or Inf
    (their data indices where ``first``, the data index of ``values[0]``, is given).

    Finite values are recognised in one pass: NaN propagates into both the minimum and the
    maximum, and an infinity is one of them (a ViT-B batch of 64 on 2 CPU threads: 1.4 ms, where
    ``isfinite(x).all()`` takes 40)."""
    values = values.detach()
    if values.is_floating_point() and values.numel():
        if bool(torch.isfinite(torch.stack(torch.aminmax(values))).all()):
            return
    finite = torch.isfinite(values)
    if bool(finite.all()):
        return
    bad = (~finite).flatten(1).any(1) if values.ndim > 1 else ~finite
    samples = [(first or 0) + i for i in bad.reshape(-1).nonzero()[:, 0].tolist()]  # scalar: [0]
    named = "samples" if first is None else "data indices"
    kinds = " and ".join(
        k for k, test in (("NaN", torch.isnan), ("Inf", torch.isinf)) if bool(test(values).any())
    )
    raise ValueError(
        f"{what} hold {kinds} values ({named} {samples[:10]}{' ...' if len(samples) > 10 else ''}"
        f"); vizkit computes nothing on non-finite inputs. Check the data pipeline (division by "
        "a zero std, an overflow in float16) or drop those samples."
    )


def check_choice(name: str, value: object, options: Sequence[str]) -> str:
    """``value`` if it is one of the string ``options``; else a ValueError listing them."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}; got {value!r}.")
    return value


def as_names(name: str, value: object) -> list[str]:
    """``value`` as a list of names: a string is one name (``metrics="sparseness"``, not the
    letters s, p, a, ...), a sequence of strings is its names; anything else is refused."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return list(value)
    raise TypeError(f"{name} must be a name or a list of names; got {value!r}.")


def check_count(name: str, value: object, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int in [minimum, maximum]; a TypeError/ValueError naming ``name`` and the
    valid range otherwise (bools and non-integral floats are refused)."""
    valid = f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {valid}; got {value!r} ({type(value).__name__}).")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {valid}; got {value}.")
    return value


def check_number(
    name: str,
    value: object,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite float in the interval from ``low`` to ``high`` (open ends where
    asked); a TypeError/ValueError naming ``name`` and the valid interval otherwise."""
    interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number in {interval}; got {value!r}.")
    value = float(value)
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if not math.isfinite(value) or below or above:
        raise ValueError(f"{name} must be a number in {interval}; got {value}.")
    return value


def check_indices(name: str, value: object, count: int, what: str) -> list[int]:
    """``value`` (an int, negative from the end, or a non-empty list of them) as indices in
    [0, count); a TypeError/ValueError naming ``name``, ``what`` there are and the valid range."""
    valid = f"the model has {count} {what} (valid: 0..{count - 1} or -{count}..-1)"
    chosen = [value] if isinstance(value, numbers.Integral) else value
    if isinstance(chosen, (str, bytes)) or not isinstance(chosen, (list, tuple, range)):
        raise TypeError(f"{name} must be an int or a list of ints; got {value!r}; {valid}.")
    if not chosen:
        raise ValueError(f"{name} is empty; pass None for all {what} or some indices.")
    for index in chosen:
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise TypeError(f"{name} must be an int or a list of ints; got {index!r}; {valid}.")
        if not -count <= index < count:
            raise ValueError(f"{name}: index {index} does not exist; {valid}.")
    return [int(i) % count for i in chosen]


def check_size(name: str, value: object, image_size: tuple[int, int]) -> tuple[int, int]:
    """``value`` (an int or (h, w)) as a window of at least 1 pixel that fits in ``image_size``."""
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    valid = f"an int or (h, w) from 1 up to the image size {image_size[0]}x{image_size[1]}"
    if len(pair) != 2 or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in pair
    ):
        raise TypeError(f"{name} must be {valid}; got {value!r}.")
    if not (1 <= pair[0] <= image_size[0] and 1 <= pair[1] <= image_size[1]):
        raise ValueError(f"{name} must be {valid}; got {value!r}.")
    return int(pair[0]), int(pair[1])
