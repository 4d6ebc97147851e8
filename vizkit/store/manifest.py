"""The manifest of an activation store (``manifest.json``): what was run (model, layers,
tokens, preprocessing, data, dtype) and what is on disk (each layer's width and tokens per
image, the shards). Settings are compared field by field, so that a store used with another
model or other settings is refused with the difference named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from torch import nn

from ..runs import model_fingerprint

__all__ = [
    "DTYPES",
    "FORMAT",
    "differences",
    "model_identity",
    "preprocessing_of",
    "read_manifest",
]

FORMAT = "vizkit-activation-store/1"
# torch dtype name -> the numpy dtype its bytes are stored as (bfloat16 as its raw 16 bits)
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


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


def differences(expected: dict, found: dict, prefix: str = "") -> list[str]:
    """``"key: expected -> found"`` for every setting that differs (nested dicts by path)."""
    lines = []
    for key in sorted(set(expected) | set(found)):
        a, b = expected.get(key), found.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            lines += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            lines.append(f"{prefix}{key}: {_short(a)} -> {_short(b)}")
    return lines


def _short(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_manifest(folder: Path) -> dict | None:
    """The manifest in ``folder``, or None where there is none."""
    file = folder / "manifest.json"
    if not file.is_file():
        return None
    manifest = json.loads(file.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"{file} is not a vizkit activation store manifest (format "
            f"{manifest.get('format')!r}, expected {FORMAT!r})."
        )
    return manifest
