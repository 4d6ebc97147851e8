"""The processes a run is split over: the default ``torch.distributed`` group, if any."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["process_group"]


def process_group() -> tuple[int, int]:
    """(processes, this one's rank) of the default ``torch.distributed`` group, (1, 0) without
    one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0
