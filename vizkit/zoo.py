"""The model zoo: trained checkpoints shipped in ``models/`` (safetensors + JSON card each).

A card holds the architecture and its kwargs, data, recipe, test accuracy, parameter count,
training time, the sha256 of the weights and the training history. `load` checks the sha256 and
reads safetensors only: a pickle is never unpickled.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import timm
from safetensors.torch import load_file
from torch import nn

__all__ = ["accuracy_over_seeds", "card", "list", "load", "models_dir", "path", "sha256"]

_PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".pkl", ".ckpt", ".tar"}


def models_dir() -> Path:
    """The zoo folder: ``$VIZKIT_MODELS`` if set, else the project's ``models/``."""
    return Path(os.environ.get("VIZKIT_MODELS", Path(__file__).resolve().parent.parent / "models"))


def list() -> builtins.list[str]:  # noqa: A001 - the zoo's verb, as in timm.list_models
    """Names of the shipped models (a card with its checkpoint beside it), sorted."""
    folder = models_dir()
    return sorted(p.stem for p in folder.glob("*.json") if p.with_suffix(".safetensors").is_file())


def _known(name: str) -> None:
    if name not in list():
        raise KeyError(f"No zoo model {name!r}. The zoo has: {', '.join(list()) or 'nothing'}.")


def path(name: str) -> Path:
    """The checkpoint file of zoo model ``name``."""
    _known(name)
    return models_dir() / f"{name}.safetensors"


def card(name: str) -> dict:
    """The model card of zoo model ``name``."""
    _known(name)
    return json.loads((models_dir() / f"{name}.json").read_text())


def accuracy_over_seeds(prefix: str, seeds: Iterable[int] | None = None) -> dict:
    """Test accuracy of the zoo models ``{prefix}_s{seed}`` (one recipe trained with several
    seeds; ``seeds`` restricts them): ``{"seeds": [...], "accuracies": [...], "mean": m,
    "std": s}`` (sample std).

    Raises:
        KeyError: no zoo model matches.
    """
    names = sorted(
        n
        for n in list()
        if n.startswith(f"{prefix}_s")
        and n[len(prefix) + 2 :].isdigit()
        and (seeds is None or int(n[len(prefix) + 2 :]) in set(seeds))
    )
    if not names:
        raise KeyError(f"No zoo models named {prefix}_s<seed>; the zoo holds {', '.join(list())}.")
    accuracies = [card(n)["test_accuracy"] for n in names]
    mean = sum(accuracies) / len(accuracies)
    spread = sum((a - mean) ** 2 for a in accuracies) / (len(accuracies) - 1) if names[1:] else 0
    return {
        "seeds": [card(n)["recipe"]["seed"] for n in names],
        "accuracies": accuracies,
        "mean": mean,
        "std": spread**0.5 if names[1:] else float("nan"),  # undefined for one seed
    }


def sha256(file: str | Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_weights(file: Path, expected_sha256: str | None) -> dict:
    if file.suffix in _PICKLE_SUFFIXES or file.suffix != ".safetensors":
        raise ValueError(
            f"Refusing {file.name}: vizkit loads .safetensors only and never "
            "unpickles a file. Convert it once, where you trust it: "
            "safetensors.torch.save_file(torch.load(f, weights_only=True), out)."
        )
    if not file.is_file():
        raise FileNotFoundError(f"No checkpoint at {file}.")
    actual = sha256(file) if expected_sha256 is not None else None
    if actual != expected_sha256:
        raise ValueError(
            f"{file.name} does not match the sha256 in its card (expected "
            f"{expected_sha256[:12]}..., got {actual[:12]}...): the file was "
            "changed or damaged. Restore it (git checkout models/) or retrain."
        )
    return load_file(str(file))


def load(
    name: str, *, checkpoint: str | Path | None = None, pretrained: bool = False, **kwargs: Any
) -> tuple[nn.Module, dict]:
    """Build a model and load its weights; return ``(model in eval mode, card)``.

    Args:
        name: a zoo name (``vit_tiny_shapes``), or a timm architecture with ``checkpoint`` (your
            own .safetensors file) or ``pretrained=True`` (timm's weights, from the local cache
            when offline).
        kwargs: architecture kwargs for a timm name (``num_classes``, ``img_size``, ...).

    Raises:
        KeyError: an unknown name; ValueError: a tampered or non-safetensors checkpoint.
    """
    if name in list():
        if checkpoint is not None or pretrained or kwargs:
            raise ValueError(f"{name!r} is a zoo model: its card fixes weights and architecture.")
        info = card(name)
        model = timm.create_model(
            info["architecture"],
            **info["kwargs"],
            pretrained_cfg_overlay=info.get("pretrained_cfg", {}),
        )
        model.load_state_dict(_read_weights(path(name), info["sha256"]))
        return model.eval(), info
    if not timm.is_model(name):
        raise KeyError(
            f"{name!r} is neither a zoo model ({', '.join(list()) or 'none'}) nor a "
            "timm architecture (timm.list_models lists those)."
        )
    model = timm.create_model(name, pretrained=pretrained, **kwargs)
    info = {"architecture": name, "kwargs": kwargs, "weights": "random"}
    if pretrained:
        info["weights"] = "timm pretrained"
    if checkpoint is not None:
        model.load_state_dict(_read_weights(Path(checkpoint), None))
        info["weights"] = str(checkpoint)
    return model.eval(), info
