"""The model zoo: trained checkpoints, a safetensors file and a JSON card each.

The core models (``vit_tiny_shapes``, ``cait_tiny_shapes``, ``resnet_tiny_shapes``,
``vit_tiny_digits``, the text-image ``clip_shapes``, the video ``vivit_shape_clips``, the
segmentation ``dpt_shape_masks``) ship inside the package
(``vizkit/zoo_models/``), so an installed wheel has them; the paper-study checkpoints live in
the repository's ``models/`` folder, found when vizkit runs from the checkout or when
``$VIZKIT_MODELS`` points there.

A card holds the architecture and its kwargs, data, recipe, test accuracy, parameter count,
training time, the sha256 of the weights and the training history. `load` checks the sha256 and
reads safetensors only: a pickle is never unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import timm
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from .models.libraries import is_library_spec, load_library_model
from .models.names import create_timm_model, did_you_mean
from .models.segmentation import SEGMENTATION_BUILDERS
from .models.text_image import BUILDERS
from .models.video import VIDEO_BUILDERS

__all__ = [
    "PACKAGE_MODELS",
    "card",
    "list_models",
    "load",
    "models_dir",
    "models_dirs",
    "path",
    "recipe_names",
    "sha256",
]

PACKAGE_MODELS = Path(__file__).resolve().parent / "zoo_models"
RECIPES_DIR = Path(__file__).resolve().parent / "train" / "recipes"  # read by vizkit.train
_CHECKOUT_MODELS = Path(__file__).resolve().parent.parent / "models"
REPOSITORY = "the vizkit repository"


def recipe_names() -> list[str]:
    """The zoo names a recipe can train (`vizkit train <name>`; `vizkit.train.recipes`)."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.json"))


def models_dir() -> Path:
    """Where `vizkit train` writes: ``$VIZKIT_MODELS`` if set, else the checkout's
    ``models/``, else ``./models``."""
    if "VIZKIT_MODELS" in os.environ:
        return Path(os.environ["VIZKIT_MODELS"])
    return _CHECKOUT_MODELS if _CHECKOUT_MODELS.is_dir() else Path.cwd() / "models"


def models_dirs() -> list[Path]:
    """Where zoo models are looked up, the first folder holding a name wins: ``$VIZKIT_MODELS``
    alone if set; else the checkout's ``models/`` (or ``./models``), then the package's own."""
    if "VIZKIT_MODELS" in os.environ:
        return [models_dir()]
    return [folder for folder in (models_dir(), PACKAGE_MODELS) if folder.is_dir()]


def _found() -> dict[str, Path]:
    """Zoo name -> its folder (a card with its checkpoint beside it), first folder first."""
    found: dict[str, Path] = {}
    for folder in reversed(models_dirs()):
        for card_file in folder.glob("*.json"):
            if card_file.with_suffix(".safetensors").is_file():
                found[card_file.stem] = folder
    return found


def list_models() -> list[str]:
    """Names of the zoo models found (`models_dirs`), sorted (as `timm.list_models`)."""
    return sorted(_found())


def _folder(name: str) -> Path:
    found = _found()
    if name in found:
        return found[name]
    _refuse_missing_paper_checkpoint(name)
    raise KeyError(
        f"No zoo model {name!r}.{did_you_mean(name, found)} vk.zoo.list_models() lists the "
        f"{_count(found)}."
    )


def _refuse_missing_paper_checkpoint(name: str) -> None:
    """A KeyError saying where to get ``name`` if it is a zoo recipe whose checkpoint is not
    in any zoo folder here (a wheel carries the core models only)."""
    if name in recipe_names():
        raise KeyError(
            f"Zoo model {name!r} is a paper-study checkpoint, not shipped inside the package: it "
            f"is in the models/ folder of {REPOSITORY}. Clone it and set VIZKIT_MODELS=<clone>/"
            f"models, or train it here with `vizkit train {name}` (looked in: "
            f"{', '.join(map(str, models_dirs())) or 'no folder'})."
        )


def path(name: str) -> Path:
    """The checkpoint file of zoo model ``name``."""
    return _folder(name) / f"{name}.safetensors"


def card(name: str) -> dict:
    """The model card of zoo model ``name``."""
    return _read_card(_folder(name) / f"{name}.json")


def _read_card(file: Path, required: Iterable[str] = ()) -> dict:
    """The JSON object in card ``file``, holding every key of ``required``.

    Raises:
        ValueError: broken JSON, not an object, or a required key missing (names the file).
    """
    try:
        info = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"Model card {file} is not valid JSON ({error}); restore it or retrain the model."
        ) from None
    if not isinstance(info, dict):
        raise ValueError(f"Model card {file} holds a JSON {type(info).__name__}, not an object.")
    missing = [key for key in required if info.get(key) is None]
    if missing:
        raise ValueError(
            f"Model card {file} lacks {', '.join(missing)}; `vizkit train` writes complete "
            "cards: restore it or retrain the model."
        )
    return info


def sha256(file: str | Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_weights(file: Path, expected_sha256: str | None) -> dict:
    """The tensors of safetensors ``file``, checked against ``expected_sha256`` when given."""
    if file.suffix != ".safetensors":
        raise ValueError(
            f"Refusing {file.name}: vizkit loads .safetensors only and never "
            "unpickles a file. Convert it once, where you trust it: "
            "safetensors.torch.save_file(torch.load(f, weights_only=True), out)."
        )
    if not file.is_file():
        raise FileNotFoundError(f"No checkpoint at {file}.")
    try:
        weights = load_file(str(file))
    except SafetensorError as error:
        raise ValueError(
            f"{file} is not a readable safetensors file ({error}): it is truncated or not "
            "safetensors. Copy it again, or save it with safetensors.torch.save_file."
        ) from None
    actual = sha256(file) if expected_sha256 is not None else None
    if actual != expected_sha256:
        raise ValueError(
            f"{file} does not match the sha256 in its card (expected "
            f"{expected_sha256[:12]}..., got {actual[:12]}...): the file was "
            "changed or damaged. Restore it (a shipped model: git checkout models/ "
            "vizkit/zoo_models/) or retrain."
        )
    return weights


def _load_weights(model: nn.Module, weights: dict, file: Path, architecture: str) -> None:
    """Load ``weights`` (from ``file``) into ``model``, or name the keys and shapes that do not
    match it."""
    expected = model.state_dict()
    shapes = [
        f"{key} {tuple(weights[key].shape)} in the file, {tuple(expected[key].shape)} in the model"
        for key in sorted(expected.keys() & weights.keys())
        if weights[key].shape != expected[key].shape
    ]
    problems = [
        _some("missing", sorted(expected.keys() - weights.keys())),
        _some("unexpected", sorted(weights.keys() - expected.keys())),
        _some("shape mismatch", shapes),
    ]
    problems = [p for p in problems if p]
    if problems:
        raise ValueError(
            f"{file} does not fit {architecture} ({'; '.join(problems)}): it holds weights "
            "of another architecture or other kwargs. Pass the model it was saved from."
        )
    model.load_state_dict(weights)


def _count(names: Iterable[str]) -> str:
    """``3 zoo models`` / ``1 zoo model``."""
    n = len(list(names))
    return f"{n} zoo model{'' if n == 1 else 's'}"


def _some(label: str, items: list[str], shown: int = 3) -> str:
    """``label: a, b, c (+ 4 more)``, or "" for no items."""
    if not items:
        return ""
    more = f" (+ {len(items) - shown} more)" if len(items) > shown else ""
    return f"{label}: {', '.join(items[:shown])}{more}"


def load(
    name: str | Path,
    *,
    checkpoint: str | Path | None = None,
    pretrained: bool = False,
    **kwargs: Any,
) -> tuple[nn.Module, dict]:
    """Build a model and load its weights; return ``(model in eval mode, card)``.

    Args:
        name: a zoo name (``vit_tiny_shapes``), a zoo-style checkpoint path (``x.safetensors``
            with its card ``x.json`` beside it), a timm architecture with ``checkpoint`` (your
            own .safetensors file, sha256-checked when a card is beside it) or
            ``pretrained=True`` (timm's weights, from the local cache when offline), or a model
            of another library, ``transformers:<hub id or folder>`` or
            ``torchvision:<builder>[:<weights>]`` (`vizkit.models.libraries`).
        kwargs: architecture kwargs for a timm name (``num_classes``, ``img_size``, ...).

    Raises:
        KeyError: an unknown name.
        FileNotFoundError: no such checkpoint or card.
        ValueError: a tampered, truncated or non-safetensors checkpoint, one of another
            architecture, or a broken card; each names the file.
    """
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str):
        raise TypeError(
            f"name must be a zoo name, a timm name or a .safetensors path; got {name!r}."
        )
    if is_library_spec(name):
        if checkpoint is not None or pretrained or kwargs:
            raise ValueError(
                f"{name!r} names a model of another library with its weights; checkpoint=, "
                "pretrained= and architecture kwargs apply to timm names."
            )
        return load_library_model(name)
    shipped = name in list_models()
    if shipped or name.endswith(".safetensors"):
        if checkpoint is not None or pretrained or kwargs:
            raise ValueError(f"{name!r} is a zoo model: its card fixes weights and architecture.")
        model, info = _load_carded(path(name) if shipped else Path(name))
        return model, info if shipped else {**info, "weights": name}
    if not timm.is_model(name):
        _refuse_missing_paper_checkpoint(name)
        close = did_you_mean(name, [*list_models(), *timm.list_models()])
        raise KeyError(
            f"{name!r} is neither a zoo model nor a timm architecture.{close}"
            f" vk.zoo.list_models() lists the {_count(list_models())}, "
            "timm.list_models('pattern*') the timm ones."
        )
    model = create_timm_model(name, pretrained=pretrained, **kwargs)
    info = {"architecture": name, "kwargs": kwargs, "weights": "random"}
    if pretrained:
        info["weights"] = "timm pretrained"
    if checkpoint is not None:
        file = Path(checkpoint)
        beside = file.with_suffix(".json")
        expected = _read_card(beside, ["sha256"])["sha256"] if beside.is_file() else None
        _load_weights(model, _read_weights(file, expected), file, name)
        info["weights"] = str(checkpoint)
    return model.eval(), info


def _load_carded(file: Path) -> tuple[nn.Module, dict]:
    """The model in checkpoint ``file`` as its card ``<stem>.json`` beside it describes."""
    card_file = file.with_suffix(".json")
    if not file.is_file() or not card_file.is_file():
        raise FileNotFoundError(
            f"{file}: a checkpoint path needs the file and its card {card_file.name} "
            f"(architecture, kwargs, sha256) beside it; or pass --model <timm name> "
            f"--checkpoint {file}."
        )
    info = _read_card(card_file, ["architecture", "kwargs", "sha256"])
    builder = {**BUILDERS, **VIDEO_BUILDERS, **SEGMENTATION_BUILDERS}.get(info["architecture"])
    if builder is not None:  # a zoo architecture of vizkit's own (text-image, video, dense)
        model = builder(**info["kwargs"])
    else:
        model = timm.create_model(
            info["architecture"],
            **info["kwargs"],
            pretrained_cfg_overlay=info.get("pretrained_cfg", {}),
        )
    _load_weights(model, _read_weights(file, info["sha256"]), file, info["architecture"])
    return model.eval(), info
