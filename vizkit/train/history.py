"""Reading training histories back: the results trackers stored through the result protocol."""

from __future__ import annotations

from collections.abc import Sequence

from ..analysis.result import Result

__all__ = ["tracked_results"]


def tracked_results(history: Sequence[dict], key: str) -> list[Result]:
    """The results a tracker stored under ``key`` (e.g. ``"residual_ratios"``), one per epoch
    that recorded it, rebuilt with `Result.from_dict`."""
    records = [record[key] for record in history if key in record]
    if not records:
        keys = sorted({k for record in history for k in record} - {"epoch"})
        raise KeyError(f"No epoch of this history recorded {key!r}; it has {keys}.")
    return [Result.from_dict(record) for record in records]
