"""A user's mistake on the command line is one line on stderr, `vizkit <cmd>: error: ...`, and
exit status 2, never a traceback; unreadable images among good ones are skipped with a warning."""

from __future__ import annotations

import io
import json
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vizkit.cli import main

SMALL = "masks_gap_s0"  # the smallest shipped model
SHIPPED = Path(__file__).resolve().parent.parent / "models"


def run(args: list[str]) -> int:
    """``main``'s exit status, also for usage errors (argparse exits)."""
    try:
        return main(args)
    except SystemExit as stop:
        return stop.code


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares width x height pixels (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = chunk(b"IDAT", zlib.compress(b""))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + idat + chunk(b"IEND", b"")


def truncated_jpeg() -> bytes:
    buffer = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buffer, "JPEG")
    return buffer.getvalue()[: len(buffer.getvalue()) // 2]


def card_beside(folder: Path, stem: str, weights: bytes, text: str = "", **changes) -> None:
    """``<stem>.safetensors`` holding ``weights``, and beside it the card ``text`` or else a copy
    of SMALL's card with ``changes`` (None drops a key)."""
    (folder / f"{stem}.safetensors").write_bytes(weights)
    card = {**json.loads((SHIPPED / f"{SMALL}.json").read_text()), **changes}
    (folder / f"{stem}.json").write_text(
        text or json.dumps({k: v for k, v in card.items() if v is not None})
    )


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    """A folder of broken inputs, and ``zoo/``: SMALL and a model with a broken card."""
    d = tmp_path_factory.mktemp("bad")
    for name, data in {
        "truncated/photo.jpg": truncated_jpeg(),
        "bomb/huge.png": png_declaring(20_000, 20_000),  # PIL: DecompressionBombError
        "bomb_warning/large.png": png_declaring(10_000, 10_000),  # DecompressionBombWarning
        "text/notes.txt": b"not an image",
    }.items():
        (d / name).parent.mkdir(exist_ok=True)
        (d / name).write_bytes(data)
    (d / "afile").write_text("")
    weights = (SHIPPED / f"{SMALL}.safetensors").read_bytes()
    card_beside(d, "truncated", weights[: len(weights) // 2])
    card_beside(d, "nosha", weights, sha256=None)
    card_beside(d, "broken", weights, text='{"architecture": ')
    card_beside(d, "other_arch", weights, architecture="resnet18", kwargs={"num_classes": 10})
    card_beside(d, "tampered", weights[:-1] + bytes([weights[-1] ^ 0xFF]))
    (d / "cut.safetensors").write_bytes(weights[:1000])
    recipe = json.loads((SHIPPED.parent / "vizkit/train/recipes" / f"{SMALL}.json").read_text())
    (d / "broken_recipe.json").write_text('{"name": ')
    (d / "unknown_recipe.json").write_text(json.dumps({**recipe, "train": {"epochz": 1}}))
    (d / "typed_recipe.json").write_text(json.dumps({**recipe, "train": {"epochs": "ten"}}))
    zoo = d / "zoo"
    zoo.mkdir()
    for suffix in (".json", ".safetensors"):
        shutil.copy(SHIPPED / f"{SMALL}{suffix}", zoo)
    card_beside(zoo, "broken_card", weights, text="[1, 2")
    return d


@pytest.fixture(autouse=True)
def tmp_zoo(bad, monkeypatch):
    """The zoo is ``bad/zoo``: a broken test can never retrain a shipped model."""
    monkeypatch.setenv("VIZKIT_MODELS", str(bad / "zoo"))


REPORT = ["report", "--model", SMALL, "--out", "{d}/out", "--data"]
TIMM = ["info", "--model", "vit_tiny_patch16_224", "--checkpoint"]


@pytest.mark.parametrize(
    "args, phrase",
    [
        ([*REPORT, "{d}/truncated"], "photo.jpg (image file is truncated"),
        ([*REPORT, "{d}/bomb"], "huge.png (Image size (400000000 pixels) exceeds limit"),
        ([*REPORT, "{d}/bomb_warning"], "could be decompression bomb"),
        ([*REPORT, "{d}/text"], "holds no readable image (png, jpg, ...); skipped notes.txt"),
        (["report", "--model", "{d}/truncated.safetensors"], "not a readable safetensors"),
        (["report", "--out", "{d}/afile"], "afile is a file; pass a folder"),
        (
            ["evaluate", "--model", "vit_tiny_patch16_224", "--limit", "2"],
            "Pass a model of the sample (e.g. --model vit_tiny_shapes",
        ),
        (["report", "--out", "{d}/no/report"], "there is no folder {d}/no"),
        (["cka", "--out", "{d}"], "is a folder; pass a file name"),
        (["info", "--batch", "0"], "argument --batch: must be a whole number >= 1; got '0'"),
        (["info", "--batch", "two"], "must be a whole number >= 1; got 'two'"),
        (["cka", "--samples", "-5"], "argument --samples: must be a whole number >= 1"),
        (["cka", "--batch-size", "0"], "argument --batch-size: must be a whole number >= 1"),
        (["report", "--n", "0"], "argument --n: must be a whole number >= 1"),
        (["train", SMALL, "--epochs", "0"], "argument --epochs: must be a whole number >= 1"),
        (
            ["info", "--device", "cuda:99"],
            "Device 'cuda:99' does not exist here; available: ['cpu']",
        ),
        (["report", "--device", "tpu"], "'tpu' is not a device"),
        (["train", SMALL, "--device", "cuda:99"], "Device 'cuda:99' does not exist here"),
        ([*TIMM, f"{{d}}/zoo/{SMALL}.safetensors"], "does not fit vit_tiny_patch16_224 (missing"),
        (["info", "--model", "{d}/other_arch.safetensors"], "does not fit resnet18 (missing: "),
        (["info", "--model", "{d}/nosha.safetensors"], "Model card {d}/nosha.json lacks sha256"),
        (["info", "--model", "{d}/broken.safetensors"], "card {d}/broken.json is not valid JSON"),
        ([*TIMM, "{d}/tampered.safetensors"], "does not match the sha256 in its card"),
        ([*TIMM, "{d}/cut.safetensors"], "{d}/cut.safetensors is not a readable safetensors"),
        (["zoo", "list"], "broken_card.json is not valid JSON"),
        (["train", "{d}/broken_recipe.json"], "broken_recipe.json is not valid JSON"),
        (["train", "{d}/unknown_recipe.json"], "unknown_recipe.json: unknown train ['epochz']"),
        (["train", "{d}/typed_recipe.json"], "train.epochs must be int; got 'ten'"),
        (["train", "no_such_recipe"], "No recipe 'no_such_recipe'"),
        (["train", SMALL], f"{SMALL}.safetensors exists: training {SMALL} would overwrite it"),
        (["cka", "--tokens", "patches"], "invalid choice: 'patches'"),
    ],
)
def test_a_mistake_is_one_line_and_exit_2(bad, capsys, args, phrase):
    assert run([a.format(d=bad) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    command = args[0]
    assert err.startswith(f"vizkit {command}: error: ") and "\n" not in err, err
    assert phrase.format(d=bad) in err


def test_unreadable_images_are_skipped_with_a_warning(bad, tmp_path, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a_cut.jpg").write_bytes(truncated_jpeg())
    (folder / "b_huge.png").write_bytes(png_declaring(20_000, 20_000))
    rng = np.random.default_rng(0)
    for name in ("c.png", "d.png"):
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(folder / name)
    args = ["report", "--model", SMALL, "--data", str(folder), "--n", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith("vizkit report: warning: skipped")
    assert "a_cut.jpg (image file is truncated" in warnings[0] and "b_huge.png" in warnings[0]
    assert "2 images from" in (tmp_path / "index.html").read_text()


def test_a_recipe_name_must_be_a_plain_file_name(tmp_path):
    from vizkit.train.recipes import load_recipe

    spec = load_recipe("vit_tiny_shapes")
    spec["name"] = "../escape"
    (tmp_path / "r.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="plain file name"):
        load_recipe(str(tmp_path / "r.json"))


def test_an_interrupted_evaluation_says_how_to_resume(monkeypatch, capsys, tmp_path):
    import vizkit.metrics

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(vizkit.metrics, "evaluate", interrupted)
    monkeypatch.delenv("VIZKIT_MODELS")  # the shipped zoo
    assert main(["evaluate", "--limit", "2", "--out", str(tmp_path / "log.jsonl")]) == 130
    err = capsys.readouterr().err
    assert err == "vizkit evaluate: interrupted; rerun the same command to resume.\n"
