"""The ledger's two decision rules on known answers, and its statistics from zoo cards written
here and from tracked residual ratios made here."""

import json
import math
import statistics

import pytest
import torch

from vizkit import ledger
from vizkit.analysis import ResidualRatios
from vizkit.analysis.residual_norms import GammaStats
from vizkit.ledger import HELD, INCONCLUSIVE, NOT_HELD, beyond_two_se, every_epoch


@pytest.mark.parametrize(
    ("value", "se", "verdict"),
    [
        (2.1, 1.0, HELD),
        (2.0, 1.0, INCONCLUSIVE),  # exactly 2 SE is not beyond it
        (-2.1, 1.0, NOT_HELD),
        (0.0, 0.0, INCONCLUSIVE),
        (0.1, 0.0, HELD),
        (5.0, math.nan, INCONCLUSIVE),  # one seed: spread unknown
    ],
)
def test_beyond_two_se(value, se, verdict):
    assert beyond_two_se(value, se) == verdict


def test_a_nan_contrast_is_refused():
    with pytest.raises(ValueError, match="The contrast is nan"):
        beyond_two_se(math.nan, 1.0)


def test_every_epoch():
    assert every_epoch([1, 2], [2, 3]) == HELD
    assert every_epoch([3, 4], [2, 3]) == NOT_HELD
    assert every_epoch([1, 4], [2, 3]) == INCONCLUSIVE
    assert every_epoch([2], [2]) == INCONCLUSIVE  # a tie is no order
    with pytest.raises(ValueError, match="same epochs; got 2 and 1"):
        every_epoch([1, 2], [3])
    with pytest.raises(ValueError, match="got 0 and 0"):
        every_epoch([], [])
    with pytest.raises(ValueError, match="must be finite"):
        every_epoch([1, math.nan], [2, 3])


def test_accuracy_over_seeds(tmp_path, monkeypatch):
    monkeypatch.setenv("VIZKIT_MODELS", str(tmp_path))
    for seed, accuracy in ((0, 0.5), (1, 0.7), (2, 0.9)):
        name = f"sweep_a_s{seed}"
        (tmp_path / f"{name}.json").write_text(
            json.dumps({"test_accuracy": accuracy, "recipe": {"seed": seed}})
        )
        (tmp_path / f"{name}.safetensors").write_bytes(b"")
    (tmp_path / "sweep_ab_s0.json").write_text("{}")  # another prefix, no checkpoint
    summary = ledger.accuracy_over_seeds("sweep_a")
    assert summary["seeds"] == [0, 1, 2] and summary["accuracies"] == [0.5, 0.7, 0.9]
    assert summary["mean"] == pytest.approx(0.7) and summary["std"] == pytest.approx(0.2)
    single = ledger.accuracy_over_seeds("sweep_a", seeds=[1])
    assert single["accuracies"] == [0.7] and math.isnan(single["std"])
    with pytest.raises(KeyError, match="No zoo models named nothing_s"):
        ledger.accuracy_over_seeds("nothing")


def test_seed_contrast_is_the_difference_of_means_against_twice_its_standard_error(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("VIZKIT_MODELS", str(tmp_path))
    runs = {"a": (0.80, 0.82, 0.84), "b": (0.70, 0.71, 0.75), "c": (0.83, 0.81, 0.85)}
    for prefix, accuracies in runs.items():
        for seed, accuracy in enumerate(accuracies):
            (tmp_path / f"{prefix}_s{seed}.json").write_text(
                json.dumps({"test_accuracy": accuracy, "recipe": {"seed": seed, "epochs": 6}})
            )
            (tmp_path / f"{prefix}_s{seed}.safetensors").write_bytes(b"")
    a, b = (100 * statistics.mean(runs[k]) for k in "ab")
    se = math.sqrt(sum(statistics.variance([100 * v for v in runs[k]]) / 3 for k in "ab"))
    held = ledger.seed_contrast("a", "b")
    assert held["value"] == pytest.approx(a - b) and held["two_se"] == pytest.approx(2 * se)
    assert held["verdict"] == "held" and ledger.seed_contrast("b", "a")["verdict"] == "not held"
    assert held["seeds"] == ([0, 1, 2], [0, 1, 2])
    assert ledger.seed_contrast("a", "c")["verdict"] == "inconclusive"
    one_seed = ledger.seed_contrast("a", "b", seeds=[0])
    assert math.isnan(one_seed["two_se"]) and one_seed["verdict"] == "inconclusive"
    (trend,) = ledger.contrast_over_budgets("a", "b", [""])
    assert trend == {"budget": "6 epochs", **held}


def test_shared_seeds_read_only_the_seeds_both_have(tmp_path, monkeypatch):
    """As the ledger reads a pair: a with seeds 0-3 against b with 1-2 compares seeds 1-2."""
    monkeypatch.setenv("VIZKIT_MODELS", str(tmp_path))
    runs = {"a": {0: 0.5, 1: 0.80, 2: 0.84, 3: 0.99}, "b": {1: 0.70, 2: 0.75}, "c": {7: 0.9}}
    for prefix, accuracies in runs.items():
        for seed, accuracy in accuracies.items():
            (tmp_path / f"{prefix}_s{seed}.json").write_text(
                json.dumps({"test_accuracy": accuracy, "recipe": {"seed": seed, "epochs": 6}})
            )
            (tmp_path / f"{prefix}_s{seed}.safetensors").write_bytes(b"")
    shared = ledger.seed_contrast("a", "b", seeds="shared")
    assert shared["seeds"] == ([1, 2], [1, 2]) and shared["value"] == pytest.approx(9.5)
    assert ledger.seed_contrast("a", "b")["seeds"] == ([0, 1, 2, 3], [1, 2])
    (trend,) = ledger.contrast_over_budgets("a", "b", [""], seeds="shared")
    assert trend == {"budget": "6 epochs", **shared}
    twice = ledger.contrast_over_budgets("a", "b", ["", ""], seeds=(s for s in (1, 2)))
    assert [t["seeds"] for t in twice] == [([1, 2], [1, 2])] * 2  # a generator serves both
    with pytest.raises(KeyError, match=r"a \(seeds \[0, 1, 2, 3\]\) and c \(seeds \[7\]\)"):
        ledger.seed_contrast("a", "c", seeds="shared")
    with pytest.raises(ValueError, match="seeds must be None, 'shared' or seed numbers"):
        ledger.seed_contrast("a", "b", seeds="common")


def _ratios(attn: list[float]) -> ResidualRatios:
    """A self-attention-only entry with the given attention ratios (FFN ratios all 1)."""
    n, ones = len(attn), torch.ones(len(attn))
    gammas = GammaStats(ones, ones, ones)
    return ResidualRatios(
        layers=[f"blocks.{i}" for i in range(n)], stage=["self-attention"] * n,
        attn=torch.tensor(attn), attn_unscaled=torch.tensor(attn), mlp=ones, mlp_unscaled=ones,
        resid_norm=ones, resid_mid_norm=ones, gamma_attn=gammas, gamma_mlp=gammas,
        has_layerscale=[False] * n, reduction="sample_fro",
    )  # fmt: skip


def test_uniformity_contrast_reads_the_last_epoch_and_decides_over_every_epoch():
    flat, spread, wide = _ratios([1.0, 1.0, 1.0]), _ratios([1.0, 2.0, 3.0]), _ratios([1, 1, 7.0])
    cv = {"spread": (2 / 3) ** 0.5 / 2, "wide": 8**0.5 / 3}  # population std / mean
    point = ledger.uniformity_contrast([flat, spread], [spread, wide])
    assert point["verdict"] == "held"
    assert point["value"] == pytest.approx(cv["wide"] - cv["spread"])
    assert point["cv_with"] == pytest.approx([0.0, cv["spread"]])
    assert math.isnan(point["two_se"])
    assert ledger.uniformity_contrast([wide], [flat])["verdict"] == "not held"
    mixed = ledger.uniformity_contrast([flat, wide], [spread, spread])
    assert mixed["verdict"] == "inconclusive"
    assert mixed["value"] == pytest.approx(cv["spread"] - cv["wide"])
    assert ledger.uniformity_contrast([flat], [spread], "mlp")["verdict"] == "inconclusive"
    with pytest.raises(ValueError, match="same epochs"):
        ledger.uniformity_contrast([flat, flat], [spread])
    with pytest.raises(ValueError, match="branch"):
        ledger.uniformity_contrast([flat], [spread], "ffn")
