"""docs/findings/sweeps.py: the recipes that would decide the ledgers' inconclusive rows are
valid recipes of models that build, derived from the shipped ones, named as the ledger reads
budgets, and ordered so that a sweep cut short leaves whole seeds."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import timm

import vizkit  # noqa: F401 - registers the paper architectures with timm
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
    monkeypatch.setattr(sweeps.vk.zoo, "list", lambda: [])  # as if the zoo had none of them
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
    monkeypatch.setattr(sweeps.vk.zoo, "list", lambda: [])
    digits = [r for r in sweeps.sweep_recipes("gpu") if r["name"].startswith("sot_digits_")]
    seeds = [r["train"]["seed"] for r in digits]
    assert seeds == sorted(seeds) and seeds[:6] == [3] * 6


def test_models_the_zoo_has_are_left_out(sweeps, monkeypatch):
    monkeypatch.setattr(sweeps.vk.zoo, "list", lambda: ["sot_digits_sum_e80_s3"])
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
