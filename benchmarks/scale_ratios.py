"""An analysis timed beside the forward (or forward and backward) it needs, for
`benchmarks/scale.py` and its row groups: the median-time ratio from rotated rounds in one
process, and the peak-memory ratio (CUDA's peak allocated on a GPU, the profiler's allocation
events on the CPU, each above what was allocated before the call)."""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from timing import rotated_rounds

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from allocation_oracle import allocated_peak  # noqa: E402


def side_by_side(
    analysis: Callable[[], object], limit: Callable[[], object], args: argparse.Namespace
) -> tuple[float, float, float]:
    """(the limit's median seconds, the analysis's time and peak memory as multiples of the
    limit's), timed in rotated rounds of the two."""
    times, _ = rotated_rounds({"analysis": analysis, "limit": limit}, args.repeats, args.device,
                              untimed=0)  # fmt: skip
    base = statistics.median(times["limit"])
    ratio = statistics.median(times["analysis"]) / base
    return base, ratio, peak(analysis, args.device) / max(1, peak(limit, args.device))


def peak(call: Callable[[], object], device: str) -> int:
    """The most bytes ``call()`` held allocated at once beyond what was allocated before."""
    if not device.startswith("cuda"):
        return allocated_peak(call)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before
