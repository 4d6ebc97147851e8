"""The two rules that decide a paper's claim from measurements, shared by the zoo's seed
contrasts (`vizkit.zoo.seed_contrast`), CaiT's residual-ratio trend points
(`vizkit.analysis.residual_norms.uniformity_contrast`) and the paper pages' claims ledgers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["HELD", "INCONCLUSIVE", "NOT_HELD", "VERDICTS", "beyond_two_se", "every_epoch"]

HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
VERDICTS = (HELD, NOT_HELD, INCONCLUSIVE)


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
