"""`features` and `evaluate_sae` over a store of a million rows (width 768, all 197 tokens of
5,077 images at 224 px), each timed once beside one encoding pass over the same rows, with
the peak of the process's anonymous resident memory above what it held before the call (the
store's pages, mapped from disk, are not counted: they are the page cache's to drop).

The rows come from a one-block ViT of ViT-B's width (random init): what is timed reads the
store, not the model, so the model's depth only sets how long the store takes to write.

    python benchmarks/scale.py --rows million [--million-expansion 16]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import timm
import torch
from torch.utils.data import Dataset

import vizkit as vk

ROWS = 1_000_000
TOKENS = 197  # ViT-B/16 at 224 px: the class token and 14 x 14 patches


class NoiseImages(Dataset):
    """``count`` images (3, 224, 224) of Gaussian noise, each drawn from its index."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randn(3, 224, 224, generator=torch.Generator().manual_seed(index))


def add_million_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--million-expansion", type=int, default=16,
                        help="latents per input width of the million-row autoencoder")  # fmt: skip
    parser.add_argument("--million-folder", default=None,
                        help="keep the store here (reused when it holds one)")  # fmt: skip


def million_rows(args: argparse.Namespace) -> list[list]:
    """The rows of the table: encoding pass, features, evaluate_sae (seconds and peak)."""
    if args.million_folder:
        return _measured(Path(args.million_folder), args)
    with tempfile.TemporaryDirectory() as folder:
        return _measured(Path(folder), args)


def _measured(folder: Path, args: argparse.Namespace) -> list[list]:
    torch.manual_seed(0)
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=224, patch_size=16, embed_dim=768, depth=1, num_heads=12, num_classes=0
    ).eval()
    images = NoiseImages(-(-ROWS // TOKENS))
    start = time.perf_counter()
    store = vk.cache_activations(model, images, folder / "store", tokens="all",
                                 batch_size=64, progress=False)  # fmt: skip
    written = time.perf_counter() - start
    sae = vk.train_sae(store, expansion=args.million_expansion, k=32, tokens=8192,
                       batch_size=4096, device=args.device, progress=False)  # fmt: skip
    sae.eval()

    def encode() -> None:
        with torch.no_grad():
            for rows in store.batches(4096):
                sae.encode(rows.to(args.device))

    base, base_peak = _once(encode)
    what = f"{len(store):,} rows of {store.width}, {sae.latents:,} latents"
    rows = [[f"store of {len(store):,} rows written (1-block ViT)", "", "",
             f"{written:.0f} s", "", ""]]  # fmt: skip
    for name, call in (("features", lambda: vk.sae.features(sae, store, progress=False)),
                       ("evaluate_sae", lambda: vk.sae.evaluate_sae(sae, store,
                                                                 progress=False))):  # fmt: skip
        seconds, peak = _once(call)
        rows.append([f"{name}, {what}", "one encoding pass", f"{base:.1f}",
                     f"{seconds / base:.2f}x", f"{peak / 2**20:.0f} MiB (pass "
                     f"{base_peak / 2**20:.0f} MiB)", "1.5x"])  # fmt: skip
    return rows


def _once(call: Callable[[], object]) -> tuple[float, int]:
    """(seconds, the most anonymous resident bytes held beyond those held before) of one
    ``call()``, the memory sampled every 20 ms."""
    before = _anonymous_bytes()
    peak, done = [before], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _anonymous_bytes())

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    done.set()
    watcher.join()
    return seconds, max(peak[0], _anonymous_bytes()) - before


def _anonymous_bytes() -> int:
    """RssAnon of this process (Linux): resident memory that is not a mapped file."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/self/status has no RssAnon: the million-row row group needs Linux.")
