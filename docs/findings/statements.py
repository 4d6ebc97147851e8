"""What the paper modules of docs/findings/ share: checking the page's words against the
measurement, and formatting values as the pages print them."""

from __future__ import annotations


class FindingChanged(AssertionError):
    """A relation the paper page states in words does not hold for the measured values."""


def expect(holds: bool, statement: str) -> None:
    """Raise `FindingChanged` unless ``holds``; ``statement`` is the page's words."""
    if not holds:
        raise FindingChanged(
            f"The paper page says: {statement}. The measurement disagrees: rewrite the page's "
            "words, then record again (python docs/findings/record.py <paper>)."
        )


def fixed(value: float, digits: int = 2) -> str:
    """``0.4871`` -> ``"0.49"``."""
    return f"{value:.{digits}f}"


def percent(fraction: float, digits: int = 1) -> str:
    """``0.6953`` -> ``"69.5 %"``."""
    return f"{100 * fraction:.{digits}f} %"
