"""The claims ledger of the paper pages (docs/ledger.py): the tables it writes, their values
against a recomputation straight from the cards' JSON, and criteria that can go either way."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import vizkit as vk

ROOT = Path(__file__).resolve().parent.parent
LEDGER = ROOT / "docs" / "ledger.py"
PAPERS = ("cait", "refiner", "masks", "sot")
ALLOWED = {"held", "not held", "inconclusive"}

pytestmark = pytest.mark.skipif(
    "sot_sum_s0" not in vk.zoo.list_models(),
    reason="the paper-study checkpoints of models/ are not in the zoo here",
)


def _import_ledger():
    """docs/ledger.py loaded from its path as docs/generate.py does (not in sys.modules)."""
    spec = importlib.util.spec_from_file_location("docs_ledger", LEDGER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ledger():
    return _import_ledger()


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The tables as the docs build makes them: the script run in a fresh process."""
    out = tmp_path_factory.mktemp("generated")
    subprocess.run([sys.executable, str(LEDGER), str(out)], check=True, cwd=ROOT,
                   capture_output=True, timeout=120)  # fmt: skip
    return out


def rows(text: str) -> list[list[str]]:
    """The body rows of the Markdown table in ``text``, as lists of cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert lines[0] == "| # | claim | our measurement | seeds | held |"
    assert lines[1] == "|---|---|---|---|---|"
    body = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]
    assert [r[0] for r in body] == [str(i) for i in range(1, len(body) + 1)]
    return [r[1:] for r in body]


def row(generated: Path, paper: str, claim_start: str) -> list[str]:
    (found,) = [r for r in rows((generated / f"ledger_{paper}.md").read_text()) if
                r[0].startswith(claim_start)]  # fmt: skip
    return found


# --- a recomputation from the cards' JSON, sharing no code with docs/ledger.py ---------------


def card_json(name: str) -> dict:
    return json.loads((vk.zoo.path(name).with_suffix(".json")).read_text())


def accuracies(prefix: str, seeds=(0, 1, 2)) -> list[float]:
    return [100 * card_json(f"{prefix}_s{s}")["test_accuracy"] for s in seeds]


def verdict(contrast: float, se: float) -> str:
    return "held" if contrast > 2 * se else "not held" if contrast < -2 * se else "inconclusive"


def difference(a: list[float], b: list[float]) -> tuple[float, float]:
    """The difference of the means of two groups of seeds and its standard error."""
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    return statistics.mean(a) - statistics.mean(b), se


def mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} %"


# --- the files -------------------------------------------------------------------------------


def test_script_writes_the_four_tables(generated, ledger):
    assert sorted(p.name for p in generated.iterdir()) == sorted(
        [f"ledger_{paper}.md" for paper in PAPERS] + ["plotly.min.js"]
    )
    for paper in PAPERS:
        body = rows((generated / f"ledger_{paper}.md").read_text(encoding="utf-8"))
        assert len(body) == len(ledger.CLAIMS[paper]) >= 4
        assert [r[0] for r in body] == [c.text.replace("|", "\\|") for c in ledger.CLAIMS[paper]]
        assert all(len(r) == 4 for r in body)


def test_write_returns_the_files_and_matches_the_script(generated, ledger, tmp_path):
    written = ledger.write(tmp_path / "new" / "folder")
    assert [p.name for p in written] == [f"ledger_{paper}.md" for paper in PAPERS]
    for path in written:
        assert path.read_text(encoding="utf-8") == (generated / path.name).read_text("utf-8")


def test_main_usage(ledger, capsys):
    assert ledger.main([]) == 2
    assert "usage" in capsys.readouterr().err


def test_every_verdict_is_allowed(generated, ledger):
    assert set(ledger.VERDICTS) == ALLOWED
    for paper in PAPERS:
        for cells in rows((generated / f"ledger_{paper}.md").read_text()):
            assert cells[3] in ALLOWED, cells


# --- measured values against the cards -------------------------------------------------------


def test_cait_layerscale_uniformity_from_the_histories(generated):
    """Fig. 4: CV across the blocks of the scaled SA ratios, per tracked epoch, from the raw
    history records of the pair at the larger budget (24 blocks), the one the verdict reads."""
    cv = {}
    for name in ("vit_deep_layerscale_shapes_d24", "vit_deep_shapes_d24"):
        per_epoch = []
        for record in card_json(name)["history"]:
            ratios = record["residual_ratios"]
            values = [v for v, s in zip(ratios["attn"]["data"], ratios["stage"], strict=True)
                      if s == "self-attention"]  # fmt: skip
            per_epoch.append(statistics.pstdev(values) / statistics.mean(values))
        cv[name] = per_epoch
    cells = row(generated, "cait", "Sec. 4.1.3, Fig. 4 (top)")
    for name, values in cv.items():
        assert f"(`{name}`) {' / '.join(f'{v:.2f}' for v in values)}" in cells[1]
    with_ls, without = cv["vit_deep_layerscale_shapes_d24"], cv["vit_deep_shapes_d24"]
    expected = ("held" if all(a < b for a, b in zip(with_ls, without, strict=True)) else
                "not held" if all(a > b for a, b in zip(with_ls, without, strict=True)) else
                "inconclusive")  # fmt: skip
    assert cells[2] == "0 (one run each)"
    assert cells[3] == expected


def test_cait_table2_from_the_cards(generated):
    late, first = accuracies("table2_vit_cls4"), accuracies("table2_vit_cls0")
    cells = row(generated, "cait", "Table 2: inserting the class token")
    assert f"(`table2_vit_cls4`) {mean_std(late)}" in cells[1]
    assert f"(`table2_vit_cls0`) {mean_std(first)}" in cells[1]
    contrast, se = difference(late, first)
    assert f"{contrast:+.2f} points (2 SE {2 * se:.2f})" in cells[1]
    assert cells[3] == verdict(contrast, se)


def test_refiner_kernel_sweep_from_the_cards(generated):
    k3, k1 = accuracies("refiner_r3_k3"), accuracies("refiner_r3_k1")
    cells = row(generated, "refiner", "Fig. 6 (App. B.3): a 3 x 3 convolution")
    assert f"k = 3, r = 3 (`refiner_r3_k3`) {mean_std(k3)}" in cells[1]
    assert f"k = 1, r = 3 (`refiner_r3_k1`) {mean_std(k1)}" in cells[1]
    contrast, se = difference(k3, k1)
    assert f"{contrast:+.2f} points (2 SE {2 * se:.2f})" in cells[1]
    assert cells[2] == "0, 1, 2"
    assert cells[3] == verdict(contrast, se)


def test_refiner_convergence_from_the_histories(generated):
    def first_epoch(prefix):
        return [100 * next(h for h in card_json(f"{prefix}_s{s}")["history"] if h["epoch"] == 1)
                ["test_accuracy"] for s in range(5)]  # fmt: skip

    r3, r1 = first_epoch("refiner_r3_k3"), first_epoch("refiner_r1_k3")
    cells = row(generated, "refiner", "Table 1: a larger expansion ratio converges faster")
    assert mean_std(r3) in cells[1] and mean_std(r1) in cells[1]
    contrast, se = difference(r3, r1)
    assert cells[3] == verdict(contrast, se)


def test_masks_saturation_contrast_from_the_cards(generated):
    """Fig. 6: (K3 - ViT) - (K5 - K3), its SE from the three groups' seed spreads."""
    gap, k3, k5 = accuracies("masks_gap"), accuracies("masks_gmm_k3"), accuracies("masks_gmm_k5")
    cells = row(generated, "masks", "Fig. 6: accuracy 'will quickly rise")
    for prefix, values in (("masks_gap", gap), ("masks_gmm_k3", k3), ("masks_gmm_k5", k5)):
        assert f"(`{prefix}`) {mean_std(values)}" in cells[1]
    contrast = 2 * statistics.mean(k3) - statistics.mean(gap) - statistics.mean(k5)
    se = math.sqrt((4 * statistics.variance(k3) + statistics.variance(gap)
                    + statistics.variance(k5)) / 3)  # fmt: skip
    assert f"{contrast:+.2f} points (2 SE {2 * se:.2f})" in cells[1]
    assert cells[3] == verdict(contrast, se)


def test_single_runs_borrow_the_reference_spread(generated):
    """Refiner Table 2: one run each; the SE of a difference of two single runs is sqrt(2) times
    the seed std of the reference (refiner_r3_k3, 3 seeds)."""
    refined = 100 * card_json("refined_vit_shapes")["test_accuracy"]
    vit = 100 * card_json("refiner_vit_shapes")["test_accuracy"]
    spread = statistics.stdev(accuracies("refiner_r3_k3"))
    cells = row(generated, "refiner", "Table 2: refining the attention maps")
    assert f"Refined-ViT (`refined_vit_shapes`) {refined:.2f} %" in cells[1]
    se = math.sqrt(2) * spread
    assert f"{refined - vit:+.2f} points (2 SE {2 * se:.2f})" in cells[1]
    assert cells[2] == f"0 (spread of `refiner_r3_k3`, seeds 0, 1, 2: {spread:.2f})"
    assert cells[3] == verdict(refined - vit, se)


def test_sot_table1_from_the_cards(generated):
    wordt, classt = accuracies("sot_wordt"), accuracies("sot_classt")
    cells = row(generated, "sot", "Table 1: the word tokens alone")
    assert mean_std(wordt) in cells[1] and mean_std(classt) in cells[1]
    contrast, se = difference(wordt, classt)
    assert cells[3] == verdict(contrast, se)


def test_labels_come_from_the_cards(ledger):
    """A label names what the cards recorded; seeds trained differently are refused."""
    cards = [("a", {"kwargs": {"kernel_size": 3}, "architecture": "x"}),
             ("b", {"kwargs": {"kernel_size": 5}, "architecture": "x"})]  # fmt: skip
    assert ledger.label("k = {kernel_size}", cards[:1]) == "k = 3"
    with pytest.raises(ValueError, match="differ in configuration"):
        ledger.label("k = {kernel_size}", cards)


# --- the criteria can fail -------------------------------------------------------------------


def _claims():
    ledger = _import_ledger()
    return [(paper, i) for paper in PAPERS for i in range(len(ledger.CLAIMS[paper]))]


def _forced(ledger, m, sign: float):
    """``m`` with its values replaced so that the claim's direction holds (sign +1) or is
    contradicted (sign -1) far beyond any spread."""
    if isinstance(m, ledger.Contrast):
        groups = tuple(
            dataclasses.replace(g, values=tuple(sign * 20 * w + j for j in
                                                (-0.01, 0.0, 0.01)[: len(g.values)]))
            for w, g in zip(m.weights, m.groups, strict=True)
        )  # fmt: skip
        return dataclasses.replace(m, groups=groups)
    n = len(m.lower.values)
    low, high = (0.1,) * n, (0.5,) * n
    lower, higher = (low, high) if sign > 0 else (high, low)
    return dataclasses.replace(m, lower=dataclasses.replace(m.lower, values=lower),
                               higher=dataclasses.replace(m.higher, values=higher))  # fmt: skip


@pytest.mark.parametrize(("paper", "index"), _claims())
def test_criterion_flips_with_the_measurement(ledger, paper, index):
    claim = ledger.CLAIMS[paper][index]
    measured = claim.measured()
    assert claim.verdict(measured) in ALLOWED
    assert tuple(measured.seeds) == claim.seeds_of(claim.budgets[-1])
    assert claim.verdict(_forced(ledger, measured, +1)) == "held"
    assert claim.verdict(_forced(ledger, measured, -1)) == "not held"


def test_two_se_needs_the_difference_to_clear_the_spread(ledger):
    def contrast(a, b, reference=None):
        groups = (ledger.Group("a", "a", tuple(a), tuple(range(len(a)))),
                  ledger.Group("b", "b", tuple(b), tuple(range(len(b)))))  # fmt: skip
        return ledger.Contrast(groups, (1.0, -1.0), "a minus b", reference)

    assert ledger.two_se(contrast([80, 81, 82], [70, 71, 72])) == "held"
    assert ledger.two_se(contrast([70, 71, 72], [80, 81, 82])) == "not held"
    assert ledger.two_se(contrast([70, 80, 90], [75, 76, 77])) == "inconclusive"
    assert ledger.two_se(contrast([90], [70])) == "inconclusive"  # one seed, no spread known
    wide = ledger.Group("ref", "ref", (60.0, 70.0, 80.0), (0, 1, 2))
    assert ledger.two_se(contrast([90], [80], wide)) == "inconclusive"
    assert ledger.two_se(contrast([90], [50], wide)) == "held"


# --- what would decide an inconclusive claim; how a contrast changes with scale --------------


def _contrast(ledger, a, b, seconds=60.0, reference=None):
    groups = (ledger.Group("a", "a", tuple(a), tuple(range(len(a))), seconds),
              ledger.Group("b", "b", tuple(b), tuple(range(len(b))), seconds))  # fmt: skip
    return ledger.Contrast(groups, (1.0, -1.0), "a minus b", reference)


def test_seeds_to_decide_is_the_first_n_where_2_se_clears_the_difference(ledger):
    m = _contrast(ledger, [80.0, 82.0, 84.0], [79.0, 81.0, 83.5])
    n = m.seeds_to_decide()
    spread = statistics.variance(m.groups[0].values) + statistics.variance(m.groups[1].values)
    assert 2 * math.sqrt(spread / n) < abs(m.value) <= 2 * math.sqrt(spread / (n - 1))
    assert f"with {n} seeds per configuration: {2 * (n - 3)} more runs" in m.cost()
    assert f"about {2 * (n - 3) * 60 / 3600:.1f} hours of training" in m.cost()
    assert "exactly zero" in _contrast(ledger, [80, 81, 82], [80, 81, 82]).cost()
    assert "train a second seed" in _contrast(ledger, [90], [80]).cost()


def test_seeds_to_decide_with_weights_and_a_borrowed_spread(ledger):
    """The saturation contrast (-1, 2, -1) and single runs that borrow a reference's spread."""
    groups = tuple(ledger.Group(k, k, v, (0, 1, 2), 60.0) for k, v in
                   (("a", (80.0, 81.0, 83.0)), ("b", (85.0, 85.5, 86.5)),
                    ("c", (86.0, 87.0, 86.0))))  # fmt: skip
    m = ledger.Contrast(groups, (-1.0, 2.0, -1.0), "saturation")
    spread = statistics.variance(groups[0].values) + 4 * statistics.variance(
        groups[1].values) + statistics.variance(groups[2].values)  # fmt: skip
    n = m.seeds_to_decide()
    assert 2 * math.sqrt(spread / n) < abs(m.value) <= 2 * math.sqrt(spread / (n - 1))
    reference = ledger.Group("ref", "ref", (70.0, 72.0, 75.0), (0, 1, 2))
    single = _contrast(ledger, [81.0], [78.5], reference=reference)
    n = single.seeds_to_decide()
    spread = 2 * statistics.variance(reference.values)
    assert 2 * math.sqrt(spread / n) < 2.5 <= 2 * math.sqrt(spread / (n - 1))


def test_cost_counts_the_seeds_the_zoo_already_has(ledger):
    """A contrast read at seed 0 only, of configurations the zoo has more seeds of: the runs to
    add are counted against the seeds the zoo has."""
    m = ledger.compare(("a", "sot_sum"), ("b", "sot_svpn_a05"), "difference",
                       reference="sot_sum")((0,))  # fmt: skip
    n = m.seeds_to_decide()
    have = {g.source: len(ledger.zoo_seeds(g)) for g in m.groups}
    assert have["sot_sum_s0"] == len(vk.ledger.accuracy_over_seeds("sot_sum")["seeds"]) >= 3
    expected = sum(max(0, n - k) for k in have.values())
    assert f"{n} seeds per configuration: {expected} more run" in m.cost()


def test_every_inconclusive_claim_says_what_would_decide_it(generated, ledger):
    for paper in PAPERS:
        text = (generated / f"ledger_{paper}.md").read_text()
        for number, claim in enumerate(ledger.CLAIMS[paper], 1):
            said = f"- **{number}.** Inconclusive: " in text
            assert said == (claim.verdict() == "inconclusive"), (paper, number)


def test_trend_sentence_says_grows_shrinks_or_reverses(ledger):
    claim = ledger.CLAIMS["sot"][0]
    small = _contrast(ledger, [80.0, 81.0, 82.0], [83.0, 84.0, 85.0])  # -3
    larger = _contrast(ledger, [80.0, 81.0, 82.0], [86.0, 87.0, 88.0])  # -6
    turned = _contrast(ledger, [90.0, 91.0, 92.0], [86.0, 87.0, 88.0])  # +4
    grows = ledger.trend_sentence(claim, [("6 epochs", small), ("12 epochs", larger)])
    assert "goes from -3.00 to -6.00 points: it grows" in grows
    assert "at 12 epochs it is beyond 2 SE against the paper (not held)" in grows
    assert "the change clears its noise" in grows
    shrinks = ledger.trend_sentence(claim, [("6 epochs", larger), ("12 epochs", small)])
    assert "it shrinks" in shrinks
    reverses = ledger.trend_sentence(claim, [("6 epochs", small), ("12 epochs", turned)])
    assert "it reverses" in reverses and "in the paper's direction (held)" in reverses
    noisy = _contrast(ledger, [70.0, 80.0, 90.0], [75.0, 85.0, 95.0])  # -5, 2 SE 16
    assert "within its noise" in ledger.trend_sentence(claim, [("a", small), ("b", noisy)])
    single = _contrast(ledger, [90.0], [80.0])  # +10, spread unknown
    unknown = ledger.trend_sentence(claim, [("a", small), ("b", single)])
    assert "no noise estimate" in unknown and "of unknown spread (inconclusive)" in unknown


def test_trend_sentence_of_a_per_epoch_claim_speaks_of_epochs(ledger):
    claim = ledger.CLAIMS["cait"][2]  # Fig. 4 (top), lower_every_epoch
    m = claim.measured()

    def pair(lower, higher):
        return dataclasses.replace(m, lower=dataclasses.replace(m.lower, values=lower),
                                   higher=dataclasses.replace(m.higher, values=higher))  # fmt: skip

    held = pair((0.1, 0.1, 0.1), (0.4, 0.3, 0.2))
    mixed = pair((0.1, 0.3, 0.1), (0.4, 0.2, 0.3))
    sentence = ledger.trend_sentence(claim, [("3 epochs", held), ("9 epochs", mixed)])
    assert "after the last epoch goes from +0.10 to +0.20 CV: it grows" in sentence
    assert "no noise estimate" in sentence and "2 SE" not in sentence
    assert "on either side in different epochs (inconclusive)" in sentence


def test_a_claim_at_two_budgets_gets_both_measurements_a_sentence_and_a_plot(ledger, monkeypatch):
    """The trend path of `table`, on a claim whose second budget is synthetic (the cards'
    configuration labels, with other accuracies): the row shows both budgets and takes the
    verdict of the larger, the plot and its sentence follow the table."""
    real = ledger.CLAIMS["sot"][1]  # WordT vs ClassT on Digits

    def measure(seeds, budget=""):
        m = real.measure(seeds, "")
        if budget:  # the larger budget: ClassT's runs, WordT 5 points above them
            a, b = m.groups
            a = dataclasses.replace(a, values=tuple(v + 5 for v in b.values))
            m = dataclasses.replace(m, groups=(a, b))
        return m

    claim = dataclasses.replace(real, measure=measure, budgets=("", "_larger"))
    monkeypatch.setitem(ledger.CLAIMS, "sot", [claim])
    with pytest.raises(ValueError, match="must name what differs"):
        ledger.table("sot")  # both budgets read the 40-epoch cards
    base = real.measure(real.seeds, "").groups[0].values
    monkeypatch.setattr(ledger, "scale_fields",
                        lambda m: {"epochs": 40 if m.groups[0].values == base else 80})  # fmt: skip
    text = ledger.table("sot")
    (cells,) = rows(text)
    assert cells[1].startswith("**40 epochs**: ") and "<br>**80 epochs**: " in cells[1]
    assert cells[3] == "held"
    assert "**1.** From 40 epochs to 80 epochs the contrast (difference) goes from" in text
    assert "+5.00 points: it reverses" in text
    assert 'id="trend-sot-1"' in text and f'<script src="{ledger.PLOTLY_JS_URL}">' in text
    assert "Inconclusive" not in text


def test_a_budget_with_its_own_seeds_reads_them_and_says_so(ledger, monkeypatch):
    """A larger budget trained at fewer seeds (`seeds_at`): each budget reads its own seeds,
    the seeds cell names them per budget, and cards with other seeds are refused."""
    real = ledger.CLAIMS["sot"][1]  # WordT vs ClassT on Digits, seeds 0, 1, 2
    asked = []

    def measure(seeds, budget=""):
        asked.append((budget, tuple(seeds)))
        return real.measure(seeds, "")

    claim = dataclasses.replace(real, measure=measure, budgets=("", "_larger"),
                                seeds_at={"_larger": (0, 1)})  # fmt: skip
    monkeypatch.setitem(ledger.CLAIMS, "sot", [claim])
    budget_number = itertools.count()  # `trend` reads the budgets in order: 40, 80, 40, ...
    monkeypatch.setattr(
        ledger, "scale_fields", lambda m: {"epochs": 40 * (1 + next(budget_number) % 2)}
    )
    (cells,) = rows(ledger.table("sot"))
    assert asked == [("", (0, 1, 2)), ("_larger", (0, 1))]
    assert cells[2] == "**40 epochs**: 0, 1, 2<br>**80 epochs**: 0, 1"
    wrong = dataclasses.replace(claim, measure=lambda seeds, budget="": real.measure((0, 1, 2)))
    monkeypatch.setitem(ledger.CLAIMS, "sot", [wrong])
    with pytest.raises(ValueError, match=r"asks for seeds \(0, 1\) at budget '_larger'"):
        ledger.table("sot")
    first_wrong = dataclasses.replace(claim, measure=lambda seeds, budget="": real.measure((0, 1)))
    monkeypatch.setitem(ledger.CLAIMS, "sot", [first_wrong])
    with pytest.raises(ValueError, match=r"asks for seeds \(0, 1, 2\) at budget ''"):
        ledger.table("sot")
    with pytest.raises(ValueError, match="seeds_at names \\['_e4'\\], not among the budgets"):
        dataclasses.replace(claim, seeds_at={"_e4": (0, 1)})


# --- a larger test set -----------------------------------------------------------------------


def _record(entries: dict, card_images: int = 2000, images: int = 20000) -> dict:
    """A docs/findings/test_size.json of {source: (seeds, accuracies on the cards' test set,
    on the larger one)} (fractions)."""
    configurations = {source: {"seeds": list(s), "cards": list(c), "larger": list(big)}
                      for source, (s, c, big) in entries.items()}  # fmt: skip
    return {"card_test_images": card_images, "test_images": images,
            "configurations": configurations}  # fmt: skip


def test_a_contrast_on_the_larger_test_set_reads_each_seeds_accuracy(ledger):
    m = _contrast(ledger, [80.0, 82.0, 84.0], [79.0, 81.0, 83.0])  # sources a, b; seeds 0-2
    record = _record({"a": ((2, 0, 1, 5), (0.84, 0.80, 0.82, 0.5), (0.845, 0.805, 0.815, 0.5)),
                      "b": ((0, 1, 2), (0.79, 0.81, 0.83), (0.78, 0.80, 0.81))})  # fmt: skip
    again = ledger.on_larger_test_set(m, record)
    assert again.groups[0].values == pytest.approx((80.5, 81.5, 84.5))
    assert again.groups[1].values == pytest.approx((78.0, 80.0, 81.0))
    assert again.weights == m.weights and [g.seeds for g in again.groups] == [(0, 1, 2)] * 2
    # what the record cannot measure again: another source, a missing seed, a history
    only_a = _record({"a": ((0, 1, 2), (0.80, 0.82, 0.84), (0.8, 0.8, 0.8))})
    assert ledger.on_larger_test_set(m, only_a) is None
    short = _record({"a": ((0, 1, 2), (0.80, 0.82, 0.84), (0.8, 0.8, 0.8)),
                     "b": ((0, 1), (0.79, 0.81), (0.78, 0.80))})  # fmt: skip
    assert ledger.on_larger_test_set(m, short) is None
    after_one = dataclasses.replace(m, groups=tuple(dataclasses.replace(g, epoch=1)
                                                    for g in m.groups))  # fmt: skip
    assert ledger.on_larger_test_set(after_one, record) is None
    stale = _record({"a": ((0, 1, 2), (0.80, 0.82, 0.85), (0.8, 0.8, 0.8)),
                     "b": ((0, 1, 2), (0.79, 0.81, 0.83), (0.78, 0.80, 0.81))})  # fmt: skip
    with pytest.raises(ValueError, match="records other accuracies of a than its cards"):
        ledger.on_larger_test_set(m, stale)


def test_the_larger_test_set_paragraph_names_the_spread_ratio_and_the_changed_rows(ledger):
    """Two rows of a fake page: one compares recorded configurations, one does not. Spreads a
    quarter as wide on the larger test set decide the first; unchanged ones do not."""
    m = _contrast(ledger, [80.0, 82.0, 84.0], [79.0, 81.0, 83.0])  # +1.00, 2 SE 3.27
    other = dataclasses.replace(m, groups=(dataclasses.replace(m.groups[0], source="c"),
                                           m.groups[1]))  # fmt: skip
    rows = [(number, ledger.Claim("sot", text, (0, 1, 2), lambda seeds, budget="", m=c: m,
                                  ledger.two_se), c)
            for number, text, c in ((1, "one", m), (2, "two", other))]  # fmt: skip
    narrow = _record({"a": ((0, 1, 2), (0.80, 0.82, 0.84), (0.81, 0.815, 0.82)),
                      "b": ((0, 1, 2), (0.79, 0.81, 0.83), (0.78, 0.785, 0.79))})  # fmt: skip
    text = ledger.larger_test_set_paragraph(rows, narrow)
    assert "On 20,000 images of the Shapes test split instead of the cards' 2,000" in text
    assert "the seed spreads of 2 Shapes configurations the ledgers compare are 0.25" in text
    assert (
        "(median; 0.25 to 0.25); spreads that were the test set's binomial noise would "
        "shrink to 0.32. They come mostly from the test set."
    ) in text
    assert (
        "Of this page's 1 row that compares these configurations, row 1 (inconclusive "
        "→ held) changes verdict on the larger test set; the verdicts above stay those"
    ) in text
    same = _record({"a": ((0, 1, 2), (0.80, 0.82, 0.84), (0.805, 0.825, 0.845)),
                    "b": ((0, 1, 2), (0.79, 0.81, 0.83), (0.785, 0.805, 0.825))})  # fmt: skip
    text = ledger.larger_test_set_paragraph(rows, same)
    assert "are 1.00 times those on the cards' test set (median; 1.00 to 1.00)" in text
    assert "They come mostly from training." in text and "no row changes verdict" in text
    assert (
        ledger.larger_test_set_paragraph(rows, _record({"x": ((0, 1), (0.5, 0.6), (0.5, 0.6))}))
        == ""
    )


def test_every_page_with_inconclusive_rows_on_shapes_says_what_a_larger_test_set_does(generated):
    for paper in PAPERS:
        text = (generated / f"ledger_{paper}.md").read_text()
        assert "**A larger test set.** On 20,000 images of the Shapes test split" in text, paper
