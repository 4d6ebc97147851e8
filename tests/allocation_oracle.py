"""The most CPU bytes a call held allocated at once, from the profiler's allocation events
(every allocation the CPU allocator serves, a kernel's own copies included): the independent
measure `vizkit.hooks.passes.peak_bytes` is tested against, and the CPU's stand-in for
`torch.cuda.max_memory_allocated` in the benchmarks (`benchmarks/live_peak.py`,
`benchmarks/method_cost.py`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def allocated_peak(call: Callable[[], object]) -> int:
    """The most CPU bytes ``call()`` held allocated at once (above what was allocated before)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    cpu = torch._C._autograd.DeviceType.CPU
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == cpu)  # fmt: skip
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak
