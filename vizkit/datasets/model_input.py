"""What input a model takes: its image size and normalization, read from the model's own
library (timm's data config, the Hugging Face image processor of its checkpoint or, for a model
built from a config, the defaults of its model type, open_clip's preprocess config), so that a
photo is prepared as the model was trained on it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from timm.data import resolve_data_config
from torch import nn

__all__ = ["Preprocessing", "model_data_config", "model_preprocessing"]

# OpenAI CLIP's statistics, open_clip's default (open_clip.constants.OPENAI_DATASET_MEAN / STD)
_OPENAI_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}  # PIL's resample codes
_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# model types whose published checkpoints save a processor other than its class's defaults
# (BitImageProcessor defaults to OpenAI CLIP's statistics; the facebook/dinov2-* checkpoints
# save ImageNet's, the shorter side at 256 and a 224 crop)
_DINOV2 = (*_IMAGENET, 224 / 256)  # mean, std, crop_pct
_CHECKPOINT_DEFAULTS = {"dinov2": _DINOV2, "dinov2_with_registers": _DINOV2}


@dataclass(frozen=True)
class Preprocessing:
    """How images are prepared for a model: resized (the shorter side to ``size / crop_pct``
    and center-cropped, or squashed to the size), scaled to [0, 1] and normalized.

    Attributes:
        input_size: (3, H, W).
        mean, std: per channel, of images in [0, 1].
        interpolation: "bicubic", "bilinear", ...
        crop_pct: the crop's share of the resized shorter side (1.0: no margin).
        crop_mode: "center" (keep the aspect, crop) or "squash" (resize to H x W).
        source: where these were read (timm's data config, a processor, ...).
    """

    input_size: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str
    crop_pct: float
    crop_mode: str
    source: str

    def data_config(self) -> dict:
        """The settings as timm's data config (``timm.data.create_transform(**cfg)``)."""
        return {"input_size": self.input_size, "mean": self.mean, "std": self.std,
                "interpolation": self.interpolation, "crop_pct": self.crop_pct,
                "crop_mode": self.crop_mode}  # fmt: skip

    def __str__(self) -> str:
        size = "x".join(map(str, self.input_size[1:]))
        stats = f"mean {_rounded(self.mean)}, std {_rounded(self.std)}"
        return f"{size} {self.interpolation} ({self.crop_mode}), {stats}: {self.source}"


def _rounded(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:.3g}" for v in values) + ")"


def model_preprocessing(
    model: nn.Module,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    size: int | tuple[int, int] | None = None,
) -> Preprocessing:
    """How ``model`` takes images, from its own library; ``mean``, ``std`` and ``size`` (an
    int or (H, W)) replace what was read."""
    found = _library_preprocessing(model)
    given = {}
    if mean is not None:
        given["mean"] = _channels("mean", mean)
    if std is not None:
        given["std"] = _channels("std", std)
        if min(given["std"]) <= 0:
            raise ValueError(f"std must be positive per channel; got {std!r}.")
    if size is not None:
        given["input_size"] = (3, *_size(size))
    if given:
        found = replace(found, **given, source=f"{found.source}; {', '.join(given)} given")
    return found


def model_data_config(model: nn.Module) -> dict:
    """`model_preprocessing` of ``model`` as timm's data config (``input_size``, ``mean``,
    ``std``, ``interpolation``, ``crop_pct``, ``crop_mode``)."""
    return model_preprocessing(model).data_config()


def _library_preprocessing(model: nn.Module) -> Preprocessing:
    if getattr(model, "pretrained_cfg", None) is not None:
        return _timm(model, "timm's data config (pretrained_cfg)")
    if type(model).__module__.startswith("transformers."):
        return _transformers(model)
    if callable(getattr(model, "encode_image", None)) and hasattr(model, "visual"):
        return _open_clip(model)
    inner = getattr(model, "model", None)  # vizkit's wrappers: zero_shot, image_tower
    if isinstance(inner, nn.Module):
        return _library_preprocessing(inner)
    return _timm(model, "timm's defaults (ImageNet statistics): the model states none")


def _timm(model: nn.Module, source: str) -> Preprocessing:
    """timm's data config of ``model``, at the input size its patch embedding was built for
    (a timm ViT made with ``img_size=`` keeps the 224 px of its ``pretrained_cfg``) or the
    ``image_size`` of its config or attribute."""
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    size = size if size is not None else _image_size(model)
    overrides = {} if size is None else {"input_size": (3, *(int(s) for s in size))}
    cfg = resolve_data_config(overrides, model=model)
    return Preprocessing(
        tuple(cfg["input_size"]), tuple(cfg["mean"]), tuple(cfg["std"]),
        cfg.get("interpolation", "bicubic"), float(cfg.get("crop_pct", 1.0)),
        cfg.get("crop_mode", "center"), source,
    )  # fmt: skip


def _transformers(model: nn.Module) -> Preprocessing:
    """The image processor saved with the checkpoint (read from its local folder), else the
    defaults of the model type's image processor class; the input size of a model built from
    a config is its config's ``image_size``."""
    config = model.config
    processor, source = _saved_processor(getattr(config, "_name_or_path", "") or "")
    saved = processor is not None
    if not saved:
        processor, source = _default_processor(config.model_type)
    if processor is None:
        return _timm(model, f"timm's defaults: transformers has no image processor for "
                            f"model type {config.model_type!r}")  # fmt: skip
    size = _as_dict(getattr(processor, "size", None))
    crop = getattr(processor, "do_center_crop", False)
    final = _hw(_as_dict(getattr(processor, "crop_size", None))) if crop else _hw(size)
    shortest = size.get("shortest_edge")
    crop_pct = final[0] / shortest if crop and shortest and final else 1.0
    if not saved or final is None:  # a model built from a config: its own image size
        final = _image_size(model) or final or (224, 224)
    resample = getattr(processor, "resample", None)
    resample = 3 if resample is None else int(resample)
    mean, std = tuple(processor.image_mean), tuple(processor.image_std)
    mean, std, rescaled = _on_unit_range(processor, mean, std)
    source += rescaled
    if not saved and config.model_type in _CHECKPOINT_DEFAULTS:
        mean, std, crop_pct = _CHECKPOINT_DEFAULTS[config.model_type]
        source += ", as its published checkpoints save it (ImageNet statistics, 256 -> 224 crop)"
    return Preprocessing(
        (3, *final), mean, std,
        _RESAMPLE.get(resample, "bicubic"), float(crop_pct),
        "center" if shortest else "squash", source,
    )  # fmt: skip


def _on_unit_range(
    processor: object, mean: tuple[float, ...], std: tuple[float, ...]
) -> tuple[tuple[float, ...], tuple[float, ...], str]:
    """``mean`` and ``std`` for images in [0, 1], where the processor normalizes pixels it
    rescaled otherwise: v = 255 x r - o (``rescale_factor`` r, ViViT's ``offset`` o = 1: [-1,
    1]), (v - m) / s = (x - (m + o) / 255 r) / (s / 255 r). Also a note for the source."""
    factor = float(getattr(processor, "rescale_factor", 1 / 255) or 1 / 255) * 255
    offset = 1.0 if getattr(processor, "offset", False) is True else 0.0
    if not getattr(processor, "do_rescale", True) or (abs(factor - 1) < 1e-9 and not offset):
        return mean, std, ""
    mean = tuple((m + offset) / factor for m in mean)
    std = tuple(v / factor for v in std)
    return mean, std, f" (its rescaling to [{-offset:g}, {factor - offset:g}] folded in)"


def _saved_processor(path: str) -> tuple[object | None, str]:
    """The image processor saved in the local folder ``path`` (none offline elsewhere)."""
    from pathlib import Path

    if not path or not (Path(path) / "preprocessor_config.json").is_file():
        return None, ""
    import transformers

    processor = transformers.AutoImageProcessor.from_pretrained(path, local_files_only=True)
    return processor, f"the image processor saved with the checkpoint ({type(processor).__name__})"


def _default_processor(model_type: str) -> tuple[object | None, str]:
    """The default image processor of ``model_type`` (a vision tower's type, e.g.
    ``clip_vision_model``, is its model's)."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type.removesuffix("_vision_model"))
    if isinstance(names, dict):  # transformers >= 5: {"pil": ..., "torchvision": ...}
        names = [names.get("pil"), *names.values()]
    names = [names] if isinstance(names, str) else list(names or ())
    for name in filter(None, names):
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls(), f"the defaults of {name} (model type {model_type!r})"
    return None, ""


def _as_dict(size: object) -> dict:
    """A processor's ``size`` / ``crop_size`` (a dict, or transformers' ``SizeDict``) as a
    dict of the keys it sets."""
    if size is None:
        return {}
    if not isinstance(size, dict):
        size = {k: getattr(size, k, None) for k in ("height", "width", "shortest_edge")}
    return {k: v for k, v in size.items() if v is not None}


def _hw(size: dict) -> tuple[int, int] | None:
    """(H, W) of a processor's size dict (``height``/``width``, or ``shortest_edge``)."""
    if "height" in size and "width" in size:
        return int(size["height"]), int(size["width"])
    if "shortest_edge" in size:
        return int(size["shortest_edge"]), int(size["shortest_edge"])
    return None


def _open_clip(model: nn.Module) -> Preprocessing:
    """open_clip's preprocess config of the model (``visual.preprocess_cfg``, set by
    ``open_clip.create_model``), else open_clip's defaults: OpenAI's statistics, bicubic, the
    shorter side resized and center-cropped."""
    cfg = dict(getattr(model.visual, "preprocess_cfg", None) or {})
    source = "open_clip's preprocess config" if cfg else "open_clip's defaults (OpenAI CLIP)"
    size = _image_size(model) or (224, 224)
    mode = {"squash": "squash"}.get(cfg.get("resize_mode", "shortest"), "center")
    return Preprocessing(
        (3, *size), tuple(cfg.get("mean", _OPENAI_CLIP[0])), tuple(cfg.get("std", _OPENAI_CLIP[1])),
        cfg.get("interpolation", "bicubic"), 1.0, mode, source,
    )  # fmt: skip


def _image_size(model: nn.Module) -> tuple[int, int] | None:
    """``image_size`` of a transformers config, or of torchvision's or open_clip's ViT (its
    ``visual`` tower)."""
    owners = (getattr(model, "config", None), model, getattr(model, "visual", None))
    for owner in owners:
        size = getattr(owner, "image_size", None)
        if isinstance(size, int) and not isinstance(size, bool):
            return size, size
        if isinstance(size, (tuple, list)) and len(size) == 2:
            return int(size[0]), int(size[1])
    return None


def _channels(name: str, values: object) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in values)
    except TypeError:
        raise TypeError(f"{name} must be 3 numbers, one per channel; got {values!r}.") from None
    if len(values) != 3:
        raise ValueError(f"{name} must be 3 numbers, one per channel; got {values!r}.")
    return values


def _size(size: object) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in pair):
        raise ValueError(f"size must be an int or (H, W) of positive ints; got {size!r}.")
    return pair
