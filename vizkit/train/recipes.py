"""Recipes: one declarative JSON file per zoo model; `run_recipe` trains it and writes the
checkpoint (.safetensors), the card (.json, with the history) into the zoo folder.

A recipe holds ``name``, ``architecture`` (a timm name, or one of vizkit's own: the video
architecture of `vizkit.models.video.VIDEO_BUILDERS`, the segmentation one of
`vizkit.models.segmentation.SEGMENTATION_BUILDERS`), ``kwargs`` for it, ``data`` ("shapes",
"digits", "shape_clips" or "shape_masks", whose labels are per pixel), ``train`` (fields of
`TrainConfig`) and optionally ``init``: names from `vizkit.train.inits.INITS` applied to the
freshly built model, and ``track``: names from `vizkit.train.callbacks.TRACKERS` recorded in
the history every epoch (default: all of them).
A recipe with ``"objective": "contrastive"`` trains a text-image model of
`vizkit.models.text_image.BUILDERS` on Shapes captions instead (``train``: fields of
`ContrastiveConfig`; `vizkit.train.text_image_recipe`).
"""

from __future__ import annotations

import json
import platform
import re
import time
from dataclasses import fields
from pathlib import Path

import timm
import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from .. import zoo
from ..datasets import Digits, Shapes, load_sample
from ..datasets.shape_clips import ShapeClips
from ..datasets.shape_masks import ShapeMasks, sample_masks
from ..models.segmentation import SEGMENTATION_BUILDERS
from ..models.text_image import BUILDERS, shapes_zero_shot
from ..models.video import VIDEO_BUILDERS
from ..runs import replaced_whole
from ..zoo import RECIPES_DIR, recipe_names
from .callbacks import TRACKERS
from .contrastive import ContrastiveConfig
from .inits import INITS
from .text_image_recipe import train_text_image
from .trainer import TrainConfig, loss_and_accuracy, train

__all__ = [
    "DATASETS",
    "load_recipe",
    "recipe_names",
    "refuse_to_overwrite",
    "run_recipe",
    "trained",
    "write_models_readme",
]

DATASETS = {
    "shapes": Shapes,
    "digits": Digits,
    "shape_clips": ShapeClips,
    "shape_masks": ShapeMasks,
}
ARCHITECTURES = {**VIDEO_BUILDERS, **SEGMENTATION_BUILDERS}  # vizkit's own, by recipe name
_CONFIGS = {"classification": TrainConfig, "contrastive": ContrastiveConfig}
_FIELDS = {"name": str, "architecture": str, "kwargs": dict, "data": str, "train": dict}
_OPTIONAL = {"init": list, "track": list, "randomized_labels": dict, "objective": str}
OBJECTIVES = ("classification", "contrastive")  # contrastive: `vizkit.train.text_image_recipe`
_JSON_NAMES = {str: "string", dict: "object", list: "list"}


def load_recipe(recipe: str | Path) -> dict:
    """A recipe by zoo name (``vit_tiny_shapes``) or by path to a JSON file, validated.

    Raises:
        FileNotFoundError: no such recipe. ValueError: broken JSON, a missing, unknown or
        mistyped key; each names the file and the key.
    """
    file = Path(recipe)
    if not file.suffix:
        file = RECIPES_DIR / f"{recipe}.json"
    if not file.is_file():
        raise FileNotFoundError(
            f"No recipe {recipe!r}. Shipped: {', '.join(recipe_names())}; or "
            "pass the path of a JSON recipe."
        )
    try:
        spec = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"Recipe {file} is not valid JSON: {error}.") from None
    if not isinstance(spec, dict):
        raise ValueError(f"Recipe {file} holds a JSON {type(spec).__name__}, not an object.")
    missing, extra = _FIELDS.keys() - spec.keys(), spec.keys() - _FIELDS.keys() - _OPTIONAL.keys()
    if missing or extra:
        raise ValueError(
            f"Recipe {file}: missing {sorted(missing)}, unknown {sorted(extra)}; "
            f"a recipe has {sorted(_FIELDS)} and optionally {sorted(_OPTIONAL)}."
        )
    for key, kind in {**_FIELDS, **_OPTIONAL}.items():
        if key in spec and not isinstance(spec[key], kind):
            raise ValueError(
                f"Recipe {file}: {key} must be a JSON {_JSON_NAMES[kind]}; got {spec[key]!r}."
            )
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", spec["name"]) or spec["name"].startswith("."):
        raise ValueError(
            f"Recipe {file}: name {spec['name']!r} must be a plain file name (letters, digits, "
            "'_', '-', '.'): it names the checkpoint written into the zoo folder."
        )
    _check_names(spec, "init", INITS, file)
    _check_names(spec, "track", TRACKERS, file)
    if spec["data"] not in DATASETS:
        raise ValueError(f"Recipe {file}: data must be one of {list(DATASETS)}.")
    objective = spec.get("objective", "classification")
    if objective not in OBJECTIVES:
        raise ValueError(f"Recipe {file}: objective must be one of {list(OBJECTIVES)}.")
    if objective == "contrastive" and (spec["data"] != "shapes" or
                                       spec["architecture"] not in BUILDERS):  # fmt: skip
        raise ValueError(
            f"Recipe {file}: a contrastive recipe trains a text-image model of vizkit's "
            f"({sorted(BUILDERS)}) on Shapes captions (data 'shapes')."
        )
    if (spec["data"] == "shape_masks") != (spec["architecture"] in SEGMENTATION_BUILDERS):
        raise ValueError(
            f"Recipe {file}: data 'shape_masks' (labels per pixel) trains a segmentation "
            f"architecture ({sorted(SEGMENTATION_BUILDERS)}), and those train on it only; got "
            f"architecture {spec['architecture']!r} with data {spec['data']!r}."
        )
    _check_train(spec["train"], file, _CONFIGS[objective])
    return spec


def _check_names(spec: dict, key: str, known: dict, file: Path) -> None:
    """Every entry of the optional list ``spec[key]`` is a name in ``known``."""
    unknown = [x for x in spec.get(key, []) if not (isinstance(x, str) and x in known)]
    if unknown:
        raise ValueError(f"Recipe {file}: unknown {key} {unknown}; known: {sorted(known)}.")


def _check_train(train: dict, file: Path, config: type = TrainConfig) -> None:
    """``train`` holds fields of ``config`` only, each of the right type and range."""
    known = [f.name for f in fields(config)]
    unknown = sorted(train.keys() - set(known))
    if unknown:
        raise ValueError(f"Recipe {file}: unknown train {unknown}; known: {known}.")
    try:
        config(**train)
    except (TypeError, ValueError) as error:
        raise ValueError(f"Recipe {file}: train.{error}") from None


def run_recipe(
    recipe: str | Path,
    out_dir: Path | None = None,
    epochs: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    device: str = "cpu",
    readme: bool = True,
) -> dict:
    """Train a recipe and write ``<name>.safetensors`` and ``<name>.json`` into ``out_dir``
    (default: the zoo folder), each whole (the checkpoint first, the card that lists it in the
    zoo last), and regenerate the folder's README unless ``readme`` is False (a sweep writes it
    once). ``epochs`` shortens the run (for tests); ``device`` trains on another device
    ("cuda"), the card records which. Returns the card.

    Raises:
        FileExistsError: the model is in ``out_dir`` already and ``overwrite`` is False (checked
        before training).
    """
    spec = load_recipe(recipe)
    objective = spec.get("objective", "classification")
    config = _CONFIGS[objective](
        **{**spec["train"], **({"epochs": epochs} if epochs is not None else {})}
    )
    out_dir = Path(out_dir) if out_dir is not None else zoo.models_dir()
    if not overwrite:
        refuse_to_overwrite(out_dir, [spec["name"]])
    start = time.perf_counter()
    if objective == "contrastive":
        model, history, fields_ = train_text_image(spec, config, progress, device)
        classifier = shapes_zero_shot(model, fields_)
    else:
        model, history, fields_ = _train_classifier(spec, config, progress, device)
        classifier = model
    seconds = time.perf_counter() - start

    out_dir.mkdir(parents=True, exist_ok=True)
    weights, card_file = _model_files(out_dir, spec["name"])
    # both written before either replaces its file; leaving the block, the checkpoint first
    with replaced_whole(card_file) as card_part, replaced_whole(weights) as weights_part:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights_part))
        card = {
            "name": spec["name"],
            "architecture": spec["architecture"],
            "kwargs": spec["kwargs"],
            **fields_,
            "recipe": config.to_dict(),
            "sample_accuracy": sample_accuracy(classifier, spec["data"]),
            "parameters": sum(p.numel() for p in model.parameters()),
            "training_seconds": round(seconds, 1),
            "trained_on": f"{_machine(device, config.threads)}, torch {torch.__version__}, "
            f"timm {timm.__version__}",
            "sha256": zoo.sha256(weights_part),
            "history": history,
        }
        card_part.write_text(json.dumps(card, indent=1) + "\n")
    if readme:
        write_models_readme(out_dir)
    return card


def _train_classifier(
    spec: dict, config: TrainConfig, progress: bool, device: str
) -> tuple[nn.Module, list[dict], dict]:
    """Train a classification recipe (a segmentation one where the data's labels are per
    pixel): (the model on the CPU, its history, its card's own fields)."""
    dataset = DATASETS[spec["data"]]
    train_data, test_data = dataset("train"), dataset("test")
    if "randomized_labels" in spec:  # the data-randomization test (Adebayo et al. 2018, 3.2)
        train_data = RandomizedLabels(train_data, **spec["randomized_labels"])
    torch.manual_seed(config.seed)
    if spec["architecture"] in ARCHITECTURES:
        model = ARCHITECTURES[spec["architecture"]](**spec["kwargs"])
    else:
        model = timm.create_model(spec["architecture"], **spec["kwargs"])
    for init in spec.get("init", []):
        INITS[init](model)
    tracked = spec.get("track", list(TRACKERS))
    trackers = [TRACKERS[t]() for t in tracked]
    history = train(model.to(device), train_data, test_data, config, trackers, progress)
    randomized = (
        {"randomized_labels": spec["randomized_labels"]} if "randomized_labels" in spec else {}
    )
    shape = list(test_data[0][0].shape)  # (C, H, W); a clip's (T, C, H, W)
    card = {
        "pretrained_cfg": {
            "input_size": shape[-3:],
            **({"frames": shape[0]} if len(shape) == 4 else {}),
            "mean": list(dataset.mean),
            "std": list(dataset.std),
            "num_classes": len(dataset.classes),
        },
        "classes": list(dataset.classes),
        "data": {
            "name": spec["data"],
            "train": len(train_data),
            "test": len(test_data),
            **randomized,
        },  # fmt: skip
        "init": spec.get("init", []),
        "track": tracked,
        "test_accuracy": history[-1]["test_accuracy"],  # per pixel for a segmentation set
        **({"test_miou": history[-1]["test_miou"]} if "test_miou" in history[-1] else {}),
    }
    return model.cpu(), history, card


def trained(folder: Path, names: list[str]) -> list[str]:
    """The names of ``names`` whose checkpoint and card are both in ``folder``."""
    return [n for n in names if all(f.exists() for f in _model_files(folder, n))]


def refuse_to_overwrite(folder: Path, names: list[str]) -> None:
    """Raise FileExistsError if a checkpoint or card of ``names`` is in ``folder`` (checked
    before training)."""
    found = {n: [f for f in _model_files(folder, n) if f.exists()] for n in names}
    found = {n: files[0] for n, files in found.items() if files}
    if found:
        one = len(found) == 1
        raise FileExistsError(
            f"{', '.join(map(str, found.values()))} {'exists' if one else 'exist'}: training "
            f"{', '.join(found)} would overwrite {'it' if one else 'them'}. Pass --force "
            "(overwrite=True) to replace, leave them out, or set VIZKIT_MODELS to another "
            "folder."
        )


class RandomizedLabels(Dataset):
    """The first ``images`` items of ``dataset`` with their labels permuted (seeded): a model
    trained on them can only memorize, so its explanations should differ from a real model's
    (Adebayo et al. 2018, "Sanity Checks for Saliency Maps", Sec. 3.2)."""

    def __init__(self, dataset: Dataset, images: int, seed: int = 0) -> None:
        if not isinstance(images, int) or not 1 <= images <= len(dataset):
            raise ValueError(f"randomized_labels.images must be in [1, {len(dataset)}].")
        self.dataset, self.images = dataset, images
        labels = torch.tensor([int(dataset[i][1]) for i in range(images)])
        order = torch.randperm(images, generator=torch.Generator().manual_seed(seed))
        self.labels = labels[order].tolist()

    def __len__(self) -> int:
        return self.images

    def __getitem__(self, i: int) -> tuple:
        item = self.dataset[i]
        return (item[0], self.labels[i], *item[2:])


def _model_files(folder: Path, name: str) -> tuple[Path, Path]:
    """The checkpoint and the card of zoo model ``name`` in ``folder``."""
    return folder / f"{name}.safetensors", folder / f"{name}.json"


def _machine(device: str, threads: int | None = None) -> str:
    """``"x86_64, 2 threads"`` on the CPU (the ``threads`` training ran with, default the
    process's), ``"cuda (NVIDIA H100 80GB HBM3)"`` on a GPU, else the device's name."""
    kind = torch.device(device).type
    if kind == "cpu":
        return f"{platform.machine()}, {threads or torch.get_num_threads()} threads"
    if kind == "cuda":
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return device


def sample_accuracy(model: torch.nn.Module, data: str) -> float:
    """Accuracy on the committed sample (``vizkit/datasets/shapes_sample.npz``; for digits,
    the test split; for Shape clips, the first 64 of the test split; for Shape masks, the
    sample's pixels): what the shipped-model tests reproduce exactly."""
    if data == "shape_clips":
        sample = ShapeClips("test", n=64)
    elif data == "shape_masks":
        sample = TensorDataset(*sample_masks()[:2])
    else:
        sample = Digits("test") if data == "digits" else TensorDataset(*load_sample()[:2])
    return loss_and_accuracy(model, sample)["accuracy"]


def write_models_readme(folder: Path) -> None:
    """Regenerate ``README.md`` of a zoo folder from the cards of every zoo model found
    (`zoo.models_dirs`; the table is never hand-edited)."""
    rows = []
    for name in zoo.list_models():
        c, file = zoo.card(name), zoo.path(name)
        if not {"test_accuracy", "recipe", "sha256"} <= set(c):
            continue
        size = file.stat().st_size / 1e6
        rows.append(
            f"| {c['name']} | {c['architecture']} | {c['data']['name']} | "
            f"{c['test_accuracy']:.4f} | {c['parameters'] / 1e6:.2f}M | {size:.1f} MB | "
            f"{c['training_seconds'] / 60:.1f} min | {c['recipe']['epochs']} | {_where(file)} |"
        )
    text = [
        "# Model zoo",
        "",
        "Checkpoints (`.safetensors`) with a JSON card each: architecture and kwargs, data,",
        "recipe, test accuracy, parameters, training time and machine, sha256, per-epoch",
        "history. Load with `vizkit.zoo.load(name)`; retrain with `vizkit train <name>` (recipes",
        "in `vizkit/train/recipes/`). The trainer writes this table from the cards. The core",
        "models ship inside the package (`vizkit/zoo_models/`, in every wheel); the paper-study",
        "checkpoints stay in this folder.",
        "",
        "| name | architecture | data | test accuracy | params | file | training | epochs | in |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    with replaced_whole(Path(folder) / "README.md") as part:
        part.write_text("\n".join(text))


def _where(file: Path) -> str:
    return "package" if file.parent == zoo.PACKAGE_MODELS else "models/"
