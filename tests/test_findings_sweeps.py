"""docs/findings/sweeps.py: the recipes that would decide the ledgers' inconclusive rows are
valid recipes of models that build, derived from the shipped ones, named as the ledger reads
budgets, and ordered so that a sweep cut short leaves whole seeds."""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

import vizkit as vk  # registers the paper architectures with timm
from vizkit.train.recipes import load_recipe

FILE = Path(__file__).resolve().parents[1] / "docs" / "findings" / "sweeps.py"


@pytest.fixture(scope="module")
def sweeps():
    spec = importlib.util.spec_from_file_location("findings_sweeps", FILE)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_derived_recipe_changes_only_seed_budget_and_name(sweeps):
    [recipe] = sweeps.Extension("sot_sum", "_e24", range(2, 3), "", epochs=24).recipes()
    base = load_recipe("sot_sum_s0")
    assert recipe["name"] == "sot_sum_e24_s2"
    assert recipe["train"] == {**base["train"], "seed": 2, "epochs": 24}
    assert {k: v for k, v in recipe.items() if k not in ("name", "train")} == {
        k: v for k, v in base.items() if k not in ("name", "train")
    }
    [deep] = sweeps.Extension("table2_vit_cls4", "_d12", range(1), "", 12,
                              (("depth", 12), ("cls_insert_layer", 10))).recipes()  # fmt: skip
    assert deep["kwargs"] == {**load_recipe("table2_vit_cls4_s0")["kwargs"], "depth": 12,
                              "cls_insert_layer": 10}  # fmt: skip


@pytest.mark.parametrize("sweep", ["gpu", "cpu"])
def test_the_written_sweep_is_valid_recipes_of_models_that_build(
    sweeps, sweep, tmp_path, monkeypatch
):
    monkeypatch.setattr(sweeps.vk.zoo, "list_models", lambda: [])  # as if the zoo had none of them
    paths = sweeps.write(sweep, tmp_path)
    recipes = [load_recipe(p) for p in paths]
    names = [r["name"] for r in recipes]
    assert (
        len(set(names))
        == len(names)
        == sum(len(e.seeds) for group in sweeps.SWEEPS[sweep] for e in group)
    )
    assert [p.name for p in paths] == sorted(
        p.name for p in paths
    )  # the files' order is the run order
    kinds = {(r["architecture"], json.dumps(r["kwargs"], sort_keys=True)) for r in recipes}
    for architecture, kwargs in kinds:  # each configuration builds (its kwargs are accepted)
        timm.create_model(architecture, **json.loads(kwargs))


def test_inside_a_group_every_configuration_gets_a_seed_before_any_gets_the_next(
    sweeps, monkeypatch
):
    monkeypatch.setattr(sweeps.vk.zoo, "list_models", lambda: [])
    digits = [r for r in sweeps.sweep_recipes("gpu") if r["name"].startswith("sot_digits_")]
    seeds = [r["train"]["seed"] for r in digits]
    assert seeds == sorted(seeds) and seeds[:6] == [3] * 6


def test_models_the_zoo_has_are_left_out(sweeps, monkeypatch):
    monkeypatch.setattr(sweeps.vk.zoo, "list_models", lambda: ["sot_digits_sum_e80_s3"])
    names = [r["name"] for r in sweeps.sweep_recipes("gpu")]
    assert "sot_digits_sum_e80_s3" not in names and "sot_digits_sum_e80_s4" in names
    with pytest.raises(KeyError, match="No sweep 'tpu'"):
        sweeps.sweep_recipes("tpu")


def test_the_cpu_sweep_runs_one_thread_each_and_otherwise_the_shipped_recipe(sweeps):
    [recipe] = sweeps.Extension("sot_svpn_a03", "", range(1, 2), "", threads=1).recipes()
    base = load_recipe("sot_svpn_a03_s0")
    assert base["train"]["threads"] == 2
    assert recipe["train"] == {**base["train"], "seed": 1, "threads": 1}
    for group in sweeps.SWEEPS["cpu"]:
        for extension in group:
            assert {r["train"]["threads"] for r in extension.recipes()} == {1}


# --- bringing a device's runs back: pack there, adopt here ----------------------------------


def _fake_run(recipe: dict, zoo: Path, **changed) -> None:
    """A checkpoint and a card as `vizkit train` writes them for ``recipe`` (weights not
    trained: adopt reads the card, the recipe and the checkpoint's bytes)."""
    zoo.mkdir(parents=True, exist_ok=True)
    weights = zoo / f"{recipe['name']}.safetensors"
    save_file({"w": torch.full((4,), float(recipe["train"]["seed"]))}, str(weights))
    card = {"name": recipe["name"], "architecture": recipe["architecture"],
            "kwargs": recipe["kwargs"], "data": {"name": recipe["data"]},
            "init": recipe.get("init", []), "recipe": {**recipe["train"], "unset": 1},
            "test_accuracy": 0.5, "parameters": 4, "training_seconds": 1.0,
            "sha256": vk.zoo.sha256(weights), **changed}  # fmt: skip
    (zoo / f"{recipe['name']}.json").write_text(json.dumps(card))


@pytest.fixture
def device_runs(sweeps, tmp_path, monkeypatch):
    """The first three recipes of the gpu sweep written here, their runs in a device's zoo."""
    monkeypatch.setattr(sweeps.vk.zoo, "list_models", lambda: [])
    paths = sweeps.write("gpu", tmp_path / "sweep")
    for extra in paths[3:]:
        extra.unlink()
    recipes = [load_recipe(p) for p in paths[:3]]
    for recipe in recipes:
        _fake_run(recipe, tmp_path / "device")
    monkeypatch.undo()
    here = tmp_path / "here"
    (here / "recipes").mkdir(parents=True)
    monkeypatch.setenv("VIZKIT_MODELS", str(here / "zoo"))
    return tmp_path / "sweep", tmp_path / "device", here, [r["name"] for r in recipes]


def test_packed_runs_are_adopted_with_their_recipes(sweeps, device_runs, tmp_path):
    sweep, device, here, names = device_runs
    parts = sweeps.pack(device, tmp_path / "out")
    assert [p.name for p in parts] == ["models-0.tar"]
    adopted = sweeps.adopt(sweep, parts, here / "zoo", here / "recipes")
    assert adopted == sorted(names)
    for name in names:
        assert (here / "zoo" / f"{name}.safetensors").read_bytes() == (
            device / f"{name}.safetensors").read_bytes()  # fmt: skip
        assert load_recipe(here / "recipes" / f"{name}.json")["name"] == name
    assert all(name in (here / "zoo" / "README.md").read_text() for name in names)
    with pytest.raises(FileExistsError, match="is in the zoo already"):
        sweeps.adopt(sweep, parts, here / "zoo", here / "recipes")


def test_pack_keeps_whole_models_within_the_devices_limits(sweeps, device_runs, tmp_path,
                                                           monkeypatch, capsys):  # fmt: skip
    _, device, _, names = device_runs
    size = max(sum(f.stat().st_size for f in device.glob(f"{n}.*")) for n in names)
    monkeypatch.setattr(sweeps, "PART_BYTES", size)  # one model a part
    monkeypatch.setattr(sweeps, "PACKED_BYTES", 2 * size + 1)  # two in all
    parts = sweeps.pack(device, tmp_path / "out")
    assert len(parts) == 2
    members = [sorted(tarfile.open(p).getnames()) for p in parts]
    assert all(len(m) == 2 and m[0].rsplit(".", 1)[0] == m[1].rsplit(".", 1)[0] for m in members)
    assert "left out (over 0 MiB): " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda f: f.with_suffix(".safetensors").write_bytes(b"x" * 8), "sha256 is not its card"),
        (lambda f: f.write_text(f.read_text().replace('"seed": ', '"seed": 1')), "train.seed"),
        (lambda f: f.rename(f.with_name("other_s0.json")), "other_s0 is not a run of"),
    ],
)
def test_a_run_that_is_not_its_recipe_is_refused_and_nothing_is_written(
    sweeps, device_runs, tmp_path, spoil, message
):
    sweep, device, here, names = device_runs
    spoil(device / f"{names[-1]}.json")
    if message.startswith("other"):
        (device / f"{names[-1]}.safetensors").rename(device / "other_s0.safetensors")
    parts = sweeps.pack(device, tmp_path / "out")
    with pytest.raises(ValueError, match=message):
        sweeps.adopt(sweep, parts, here / "zoo", here / "recipes")
    assert not (here / "zoo").exists() and not any((here / "recipes").iterdir())


def test_a_runs_time_is_its_bases_card_time_scaled_by_epochs_and_depth(sweeps):
    card = vk.zoo.card("sot_sum_s0")
    longer = sweeps.Extension("sot_sum", "_e24", range(1), "", epochs=24)
    assert longer.minutes() == pytest.approx(card["training_seconds"] * 24 / 6 / 60)
    assert card["recipe"]["epochs"] == 6
    base = vk.zoo.card("table2_vit_cls0_s0")
    deeper = sweeps.Extension("table2_vit_cls0", "_d12", range(1), "", 12, (("depth", 12),))
    scale = 12 / base["recipe"]["epochs"] * 12 / base["kwargs"]["depth"]
    assert deeper.minutes() == pytest.approx(base["training_seconds"] * scale / 60)


def test_list_says_what_each_sweep_would_cost(sweeps, capsys):
    assert sweeps.main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cpu: ") and "\ngpu: " in out
    assert "hours at their bases' card times (one run at a time)" in out
    assert "  sot_sum_e24 seeds 0-2: SoT 1, 3, 5, 7, 9-14; " in out
