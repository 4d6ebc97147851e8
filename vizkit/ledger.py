"""The paper ledgers' statistics and verdicts: a claim's contrast measured from the zoo cards
(accuracy over seeds) or from tracked histories (CaiT's residual-ratio uniformity), decided by
one of two rules into one of `VERDICTS`. The contrasts are the points `vizkit.viz.scale_trend`
draws; the paper pages' claims ledgers (docs/ledger.py) decide with the same rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .analysis import ResidualRatios, ratio_uniformity
from .hooks.inputs import check_choice
from .zoo import card, list_models

__all__ = [
    "HELD",
    "INCONCLUSIVE",
    "NOT_HELD",
    "VERDICTS",
    "accuracy_over_seeds",
    "beyond_two_se",
    "contrast_over_budgets",
    "every_epoch",
    "seed_contrast",
    "uniformity_contrast",
]

HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
VERDICTS = (HELD, NOT_HELD, INCONCLUSIVE)


# --- the two rules ---------------------------------------------------------------------------


def beyond_two_se(value: float, se: float) -> str:
    """A contrast (positive: the paper's direction) against its standard error: held above
    2 SE, not held below -2 SE, inconclusive in between or with an unknown (NaN) spread.

    Raises:
        ValueError: the contrast itself is not a finite number (a NaN accuracy decides nothing).
    """
    if not math.isfinite(value):
        raise ValueError(f"The contrast is {value}: a claim is decided on finite measurements.")
    if not math.isfinite(se):
        return INCONCLUSIVE
    return HELD if value > 2 * se else NOT_HELD if value < -2 * se else INCONCLUSIVE


def every_epoch(lower: Sequence[float], higher: Sequence[float]) -> str:
    """One quantity per tracked epoch for two runs, the paper saying ``lower`` is below
    ``higher``: held if it is at every epoch, not held if it is above at every epoch, else
    inconclusive.

    Raises:
        ValueError: the runs have different or no epochs, or a value is not finite.
    """
    if len(lower) != len(higher) or not lower:
        raise ValueError(
            f"Compare runs over the same epochs; got {len(lower)} and {len(higher)} values."
        )
    if not all(math.isfinite(v) for v in (*lower, *higher)):
        raise ValueError(f"Per-epoch values must be finite; got {list(lower)} and {list(higher)}.")
    pairs = list(zip(lower, higher, strict=True))
    if all(a < b for a, b in pairs):
        return HELD
    if all(a > b for a, b in pairs):
        return NOT_HELD
    return INCONCLUSIVE


# --- accuracy over seeds, from the zoo cards -------------------------------------------------


def accuracy_over_seeds(prefix: str, seeds: Iterable[int] | None = None) -> dict:
    """Test accuracy of the zoo models ``{prefix}_s{seed}`` (one recipe trained with several
    seeds; ``seeds`` restricts them): ``{"seeds": [...], "accuracies": [...], "mean": m,
    "std": s}`` (sample std).

    Raises:
        KeyError: no zoo model matches.
    """
    names = sorted(
        n
        for n in list_models()
        if n.startswith(f"{prefix}_s")
        and n[len(prefix) + 2 :].isdigit()
        and (seeds is None or int(n[len(prefix) + 2 :]) in set(seeds))
    )
    if not names:
        held = ", ".join(list_models())
        raise KeyError(f"No zoo models named {prefix}_s<seed>; the zoo holds {held}.")
    accuracies = [card(n)["test_accuracy"] for n in names]
    mean = sum(accuracies) / len(accuracies)
    spread = sum((a - mean) ** 2 for a in accuracies) / (len(accuracies) - 1) if names[1:] else 0
    return {
        "seeds": [card(n)["recipe"]["seed"] for n in names],
        "accuracies": accuracies,
        "mean": mean,
        "std": spread**0.5 if names[1:] else float("nan"),  # undefined for one seed
    }


def seed_contrast(a: str, b: str, seeds: Iterable[int] | str | None = None) -> dict:
    """Mean test accuracy of the zoo models ``{a}_s{seed}`` minus that of ``{b}_s{seed}``, in
    points: ``{"value": d, "two_se": 2 SE, "verdict": v, "seeds": (seeds of a, seeds of b)}``,
    with SE = sqrt(s_a^2 / n_a + s_b^2 / n_b) from the seed spreads and the verdict of
    `beyond_two_se`: "held" if d > 2 SE, "not held" if d < -2 SE, else "inconclusive" (also
    with one seed, whose spread is unknown). ``seeds=None`` takes every seed the zoo has of
    each, which may be more than a ledger row reads; ``seeds="shared"`` the seeds both have (as
    the ledger reads a pair); or pass the seeds.

    Raises:
        KeyError: no zoo model matches ``a`` or ``b``, or ``"shared"`` finds no common seed.
        ValueError: ``seeds`` is a string other than ``"shared"``.
    """
    if isinstance(seeds, str):
        if seeds != "shared":
            raise ValueError(f"seeds must be None, 'shared' or seed numbers; got {seeds!r}.")
        have = [set(accuracy_over_seeds(prefix)["seeds"]) for prefix in (a, b)]
        seeds = sorted(have[0] & have[1])
        if not seeds:
            raise KeyError(f"{a} (seeds {sorted(have[0])}) and {b} (seeds {sorted(have[1])}) "
                           "share no seed.")  # fmt: skip
    groups = [accuracy_over_seeds(prefix, seeds) for prefix in (a, b)]
    value = 100 * (groups[0]["mean"] - groups[1]["mean"])
    se = 100 * sum(g["std"] ** 2 / len(g["seeds"]) for g in groups) ** 0.5
    verdict = beyond_two_se(value, se)
    seeds_used = tuple(g["seeds"] for g in groups)
    return {"value": value, "two_se": 2 * se, "verdict": verdict, "seeds": seeds_used}


def contrast_over_budgets(
    a: str, b: str, budgets: Iterable[str], seeds: Iterable[int] | str | None = None
) -> list[dict]:
    """`seed_contrast` of ``{a}{budget}`` against ``{b}{budget}`` for each card-name suffix in
    ``budgets`` (smallest first, e.g. ``("", "_e80")``), each labelled ``"<epochs> epochs"``
    from its first card's recipe: the points `vizkit.viz.scale_trend` draws. ``seeds`` as in
    `seed_contrast`, at every budget (``"shared"``: the seeds both have at that budget)."""
    if seeds is not None and not isinstance(seeds, str):
        seeds = tuple(seeds)  # read at every budget, not used up by the first
    points = []
    for budget in budgets:
        contrast = seed_contrast(f"{a}{budget}", f"{b}{budget}", seeds)
        epochs = card(f"{a}{budget}_s{contrast['seeds'][0][0]}")["recipe"]["epochs"]
        points.append({"budget": f"{epochs} epochs", **contrast})
    return points


# --- residual-ratio uniformity, from tracked histories ---------------------------------------


def uniformity_contrast(
    with_layerscale: list[ResidualRatios], without: list[ResidualRatios], branch: str = "attn"
) -> dict:
    """CaiT's Fig. 4 claim (LayerScale makes the ratios more uniform across layers) for two
    tracked histories of the same recipe, one entry per epoch each, as a point of
    `vizkit.viz.scale_trend`: ``value`` is the coefficient of variation of ``branch``'s ratios
    ("attn" or "mlp", self-attention layers; `vizkit.analysis.ratio_uniformity`) without
    LayerScale minus with it after the last epoch (positive: as the paper says); ``verdict`` is
    `every_epoch`'s, "held" if it is lower with LayerScale at every epoch; ``two_se`` is NaN
    (one run each); ``cv_with`` and ``cv_without`` are the per-epoch CVs.
    """
    check_choice("branch", branch, ("attn", "mlp"))
    if len(with_layerscale) != len(without) or not without:
        raise ValueError(
            f"Compare histories of the same epochs; got {len(with_layerscale)} and "
            f"{len(without)} entries."
        )
    lower = ratio_uniformity(with_layerscale)[branch]["cv"]
    higher = ratio_uniformity(without)[branch]["cv"]
    verdict = every_epoch(lower, higher)
    return {"value": higher[-1] - lower[-1], "two_se": math.nan, "verdict": verdict,
            "cv_with": lower, "cv_without": higher}  # fmt: skip
