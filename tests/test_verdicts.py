"""The claims' two decision rules (vizkit.verdicts), on known answers."""

import math

import pytest

from vizkit.verdicts import HELD, INCONCLUSIVE, NOT_HELD, beyond_two_se, every_epoch


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
