"""Recipes: one declarative JSON file per zoo model; `run_recipe` trains it and writes the
checkpoint (.safetensors), the card (.json, with the history) into the zoo folder.

A recipe holds ``name``, ``architecture`` (a timm name), ``kwargs`` for it, ``data`` ("shapes" or
"digits"), ``train`` (fields of `TrainConfig`) and optionally ``init``: names from
`vizkit.train.inits.INITS` applied to the freshly built model, and ``track``: names from
`vizkit.train.callbacks.TRACKERS` recorded in the history every epoch (default: all of them).
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import timm
import torch
from safetensors.torch import save_file
from torch.utils.data import TensorDataset

from .. import zoo
from ..datasets import Digits, Shapes, load_sample
from .callbacks import TRACKERS
from .inits import INITS
from .trainer import TrainConfig, evaluate, train

__all__ = ["DATASETS", "load_recipe", "recipe_names", "run_recipe", "write_models_readme"]

RECIPES_DIR = Path(__file__).parent / "recipes"
DATASETS = {"shapes": Shapes, "digits": Digits}
_FIELDS = {"name", "architecture", "kwargs", "data", "train"}
_OPTIONAL = {"init", "track"}


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.json"))


def load_recipe(recipe: str | Path) -> dict:
    """A recipe by zoo name (``vit_tiny_shapes``) or by path to a JSON file, validated."""
    file = Path(recipe)
    if not file.suffix:
        file = RECIPES_DIR / f"{recipe}.json"
    if not file.is_file():
        raise FileNotFoundError(
            f"No recipe {recipe!r}. Shipped: {', '.join(recipe_names())}; or "
            "pass the path of a JSON recipe."
        )
    spec = json.loads(file.read_text())
    missing, extra = _FIELDS - set(spec), set(spec) - _FIELDS - _OPTIONAL
    if missing or extra:
        raise ValueError(
            f"Recipe {file.name}: missing {sorted(missing)}, unknown {sorted(extra)}; "
            f"a recipe has {sorted(_FIELDS)} and optionally {sorted(_OPTIONAL)}."
        )
    unknown_inits = set(spec.get("init", [])) - set(INITS)
    if unknown_inits:
        raise ValueError(
            f"Recipe {file.name}: unknown init {sorted(unknown_inits)}; known: {sorted(INITS)}."
        )
    unknown_trackers = set(spec.get("track", [])) - set(TRACKERS)
    if unknown_trackers:
        raise ValueError(
            f"Recipe {file.name}: unknown track {sorted(unknown_trackers)}; known: "
            f"{sorted(TRACKERS)}."
        )
    if spec["data"] not in DATASETS:
        raise ValueError(f"Recipe {file.name}: data must be one of {list(DATASETS)}.")
    TrainConfig(**spec["train"])  # unknown training fields fail here, before any work
    return spec


def run_recipe(
    recipe: str | Path,
    out_dir: Path | None = None,
    epochs: int | None = None,
    progress: bool = True,
) -> dict:
    """Train a recipe and write ``<name>.safetensors`` and ``<name>.json`` into ``out_dir``
    (default: the zoo folder). ``epochs`` shortens the run (for tests). Returns the card."""
    spec = load_recipe(recipe)
    config = TrainConfig(**{**spec["train"], **({"epochs": epochs} if epochs else {})})
    dataset = DATASETS[spec["data"]]
    train_data, test_data = dataset("train"), dataset("test")
    torch.manual_seed(config.seed)
    model = timm.create_model(spec["architecture"], **spec["kwargs"])
    for init in spec.get("init", []):
        INITS[init](model)
    tracked = spec.get("track", list(TRACKERS))
    start = time.perf_counter()
    history = train(
        model, train_data, test_data, config, [TRACKERS[t]() for t in tracked], progress
    )
    seconds = time.perf_counter() - start

    out_dir = Path(out_dir) if out_dir is not None else zoo.models_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / f"{spec['name']}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    image_size = test_data[0][0].shape
    card = {
        "name": spec["name"],
        "architecture": spec["architecture"],
        "kwargs": spec["kwargs"],
        "pretrained_cfg": {
            "input_size": list(image_size),
            "mean": list(dataset.mean),
            "std": list(dataset.std),
            "num_classes": len(dataset.classes),
        },
        "classes": list(dataset.classes),
        "data": {"name": spec["data"], "train": len(train_data), "test": len(test_data)},
        "recipe": config.to_dict(),
        "init": spec.get("init", []),
        "track": tracked,
        "test_accuracy": history[-1]["test_accuracy"],
        "sample_accuracy": sample_accuracy(model, spec["data"]),
        "parameters": sum(p.numel() for p in model.parameters()),
        "training_seconds": round(seconds, 1),
        "trained_on": f"{platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, timm {timm.__version__}",
        "sha256": zoo.sha256(weights),
        "history": history,
    }
    (out_dir / f"{spec['name']}.json").write_text(json.dumps(card, indent=1) + "\n")
    write_models_readme(out_dir)
    return card


def sample_accuracy(model: torch.nn.Module, data: str) -> float:
    """Accuracy on the committed sample (``data/shapes_sample.npz``; for digits, the test split):
    what the shipped-model tests reproduce exactly."""
    sample = Digits("test") if data == "digits" else TensorDataset(*load_sample()[:2])
    return evaluate(model, sample)["accuracy"]


def write_models_readme(folder: Path) -> None:
    """Regenerate ``README.md`` of a zoo folder from its cards (the table is never hand-edited)."""
    rows = []
    for file in sorted(Path(folder).glob("*.json")):
        c = json.loads(file.read_text())
        if not {"test_accuracy", "recipe", "sha256"} <= set(c):
            continue
        size = (Path(folder) / f"{file.stem}.safetensors").stat().st_size / 1e6
        rows.append(
            f"| {c['name']} | {c['architecture']} | {c['data']['name']} | "
            f"{c['test_accuracy']:.4f} | {c['parameters'] / 1e6:.2f}M | {size:.1f} MB | "
            f"{c['training_seconds'] / 60:.1f} min | {c['recipe']['epochs']} |"
        )
    text = [
        "# Model zoo",
        "",
        "Checkpoints (`.safetensors`) with a JSON card each: architecture and kwargs, data,",
        "recipe, test accuracy, parameters, training time and machine, sha256, per-epoch",
        "history. Load with `vizkit.zoo.load(name)`; retrain with `vizkit train <name>` (recipes",
        "in `vizkit/train/recipes/`). The trainer writes this table from the cards.",
        "",
        "| name | architecture | data | test accuracy | params | file | training | epochs |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    (Path(folder) / "README.md").write_text("\n".join(text))
