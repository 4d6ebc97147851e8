"""Activation store cost: writing it against the plain forward over the same images, and reading
its rows back in order against reading them at random.

deit_small_patch16_224 (random weights), ``--images`` random images at 224 px, batches of
``--batch``, side by side in one run (rounds rotated as in benchmarks/capture.py):
  forward   the plain forward over the images, batch by batch, under torch.inference_mode
  store     vk.cache_activations(model, images, layers=-1, tokens="patches", dtype=float16)
            into a fresh folder: the same forwards, the activations cast and written
The store's bytes per second are printed beside the disk's: the same bytes written with
numpy.tofile and fsync'd (where the store writes no slower than that, the disk is the limit).
Then, on one store written (its files in the page cache: no disk is read), rows per second:
  in order  store.batches(4096): consecutive rows, one memory-mapped slice per batch
  at random store[i] for 4096 random rows, one at a time (a shuffling DataLoader's access)
Usage: python benchmarks/store.py [--images 128] [--batch 32] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from timing import build, header, parse_args, precision, print_table, rotated_rounds

import vizkit as vk

IMAGES = 128


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], images=IMAGES)
    with precision(args):
        model, _ = build(args.model, args)
        images = torch.randn(args.images, 3, args.size, args.size).to(args.device)
        folder = Path(tempfile.mkdtemp(prefix="vizkit-store-bench-"))

        def forward() -> None:
            with torch.inference_mode():
                for batch in images.split(args.batch):
                    model(batch)

        def store() -> None:
            shutil.rmtree(folder / "s", ignore_errors=True)
            vk.cache_activations(model, images, folder / "s", layers=-1, tokens="patches",
                                 dtype=torch.float16, batch_size=args.batch,
                                 progress=False)  # fmt: skip

        times, faults = rotated_rounds({"forward": forward, "store": store}, args.repeats,
                                       args.device, untimed=1)  # fmt: skip
        print_table(times, faults, "forward", args, header(args, f"; {args.images} images"))
        written = vk.store.ActivationStore(folder / "s")
        size = len(written) * written.width * 2  # float16
        store_rate = size / statistics.median(times["store"])
        print(f"\nstore {store_rate / 2**20:,.0f} MiB/s of activations written; the disk "
              f"{_disk_rate(folder, size) / 2**20:,.0f} MiB/s (numpy.tofile + fsync)")  # fmt: skip
        print(f"reading {written!r} ({size / 2**20:.0f} MiB)")
        for name, read in (("in order", _in_order), ("at random", _at_random)):
            rates = [read(written) for _ in range(args.repeats)]
            print(f"{name:<10} {statistics.median(rates):14,.0f} rows/s")
        shutil.rmtree(folder)


def _disk_rate(folder: Path, size: int) -> float:
    """Bytes per second of writing ``size`` bytes to ``folder`` and syncing them to disk."""
    data = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    file = folder / "disk.bin"
    start = time.perf_counter()
    with open(file, "wb") as handle:
        data.tofile(handle)
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - start
    file.unlink()
    return size / seconds


def _in_order(store: vk.store.ActivationStore) -> float:
    start = time.perf_counter()
    rows = sum(len(batch) for batch in store.batches(4096))
    return rows / (time.perf_counter() - start)


def _at_random(store: vk.store.ActivationStore, rows: int = 4096) -> float:
    picks = torch.randint(len(store), (rows,)).tolist()
    start = time.perf_counter()
    for i in picks:
        store[i]
    return rows / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
