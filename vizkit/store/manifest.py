"""The manifest of an activation store (``manifest.json``): what was run (model, layers,
tokens, preprocessing, data, dtype) and what is on disk (each layer's width and tokens per
image, the shards). Settings are compared field by field, so that a store used with another
model or other settings is refused with the difference named."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from ..hooks.inputs import check_count
from ..runs import model_fingerprint
from ..runs.settings import Settings, differences
from .tokens import check_tokens

__all__ = [
    "DTYPES",
    "FORMAT",
    "StoreSettings",
    "differences",
    "model_identity",
    "preprocessing_of",
    "read_manifest",
]

FORMAT = "vizkit-activation-store/1"
# torch dtype name -> the numpy dtype its bytes are stored as (bfloat16 as its raw 16 bits)
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


@dataclass(frozen=True)
class StoreSettings(Settings):
    """What a store was written from and how: compared field by field when a store is
    resumed or used (`vk.cache_activations`).

    Attributes:
        model: the model's class and `model_fingerprint` (`model_identity`).
        layers: the hook names stored, in order.
        tokens: "patches", "all", "class", "registers", or k random patches per image.
        seed: the seed the k random patches are drawn from (with the image's index).
        dtype: "float32", "float16" or "bfloat16", as the rows are stored.
        image_size: (H, W) of the images.
        preprocessing: the model's preprocessing as its library states it (None: unknown).
        data: the data's class, its image count and hashes of sampled images.
    """

    model: dict[str, Any]
    layers: tuple[str, ...]
    tokens: str | int
    seed: int
    dtype: str
    image_size: tuple[int, int]
    preprocessing: str | None
    data: dict[str, Any]

    def __post_init__(self) -> None:
        check_tokens(self.tokens)
        check_count("seed", self.seed, 0)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}.")
        if not self.layers:
            raise ValueError("A store holds at least one layer.")


def model_identity(model: nn.Module) -> dict:
    """{"class": the model's class name, "fingerprint": `model_fingerprint`}."""
    return {"class": type(model).__qualname__, "fingerprint": model_fingerprint(model)}


def preprocessing_of(model: nn.Module) -> str | None:
    """The model's preprocessing as its library states it, where vizkit can read it."""
    from ..datasets.model_input import model_preprocessing

    try:
        return str(model_preprocessing(model))
    except (ValueError, TypeError, AttributeError):
        return None


def read_manifest(folder: Path) -> dict | None:
    """The manifest in ``folder`` (its settings checked to be `StoreSettings`, its layout
    complete), or None where there is none; a damaged or foreign one is refused."""
    file = folder / "manifest.json"
    if not file.is_file():
        return None
    fix = ("Write the store again with vk.cache_activations into a new folder (or delete "
           "this one).")  # fmt: skip
    try:
        manifest = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{file} is damaged (not JSON: {error}). {fix}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(
            f"{file} is not a vizkit activation store manifest (format {found!r}, expected "
            f"{FORMAT!r})."
        )
    missing = [key for key in ("settings", "images", "shard_images", "layers")
               if key not in manifest]  # fmt: skip
    if missing:
        raise ValueError(f"{file} is damaged (no {', '.join(missing)}). {fix}")
    try:
        StoreSettings.from_json(manifest["settings"], str(file))
        check_count("images", manifest["images"])
        check_count("shard_images", manifest["shard_images"])
        for name, spec in manifest["layers"].items():
            for key in ("width", "tokens_per_image", "prefix_tokens"):
                check_count(
                    f"layers[{name!r}].{key}", spec[key], 0 if key == "prefix_tokens" else 1
                )
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise ValueError(f"{file} is damaged or was edited ({error}). {fix}") from None
    return manifest
