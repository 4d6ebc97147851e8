"""A loader's next batch read by a thread while the model works on an accelerator."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

from torch import nn

from .hooks.inputs import model_device

Item = TypeVar("Item")
_END = object()


def read_ahead(items: Iterable[Item], model: nn.Module, name: str) -> Iterator[Item]:
    """``items`` in order, read ahead by a thread (`prefetched`) when ``model`` computes on an
    accelerator, and in the calling thread when it computes on the CPU.

    On the CPU the model's intra-op threads already keep every core busy, so a reading thread
    overlaps nothing, and it was measured to cost wall time at equal CPU time (`vk.cka_matrix`
    on deit_tiny, 256 images in batches of 32, 2 threads: 1.20-1.28x the plain forward's wall
    time with the thread, 1.09-1.15x without it; ``benchmarks/read_ahead.py``). The cost is the
    reader's tensor work (the loader's indexing and collation) beside the forward's: with
    ready-made batches (a list of tensors) the thread costs nothing (4.16 against 4.12 s).
    """
    if model_device(model).type == "cpu":
        return iter(items)
    return prefetched(items, name)


def prefetched(items: Iterable[Item], name: str = "vizkit-prefetch") -> Iterator[Item]:
    """``items`` in order, the next one loaded by a thread while this one is used, so that a
    loader's reading, decoding and collating (which release the GIL) overlap the model's work;
    at most two items are alive at once. An error while loading is raised here, at the item it
    concerns; closing the generator stops the thread at its next item.

    Args:
        items: any iterable (a DataLoader, a generator of batches).
        name: the thread's name (seen in a debugger or a profile).
    """
    ready: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def offer(entry: tuple) -> bool:
        """Put ``entry`` once there is room; False once the consumer has stopped."""
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def load() -> None:
        try:
            for item in items:
                if not offer((item, None)):
                    return
        except BaseException as error:  # handed over to the consumer, raised there
            offer((_END, error))
            return
        offer((_END, None))

    threading.Thread(target=load, name=name, daemon=True).start()
    try:
        while True:
            item, error = ready.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        stop.set()
