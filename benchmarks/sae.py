"""Sparse autoencoder training throughput: vizkit's train_sae against Overcomplete's on the
same store's rows, in tokens (rows) per second.

A store of deit_small_patch16_224 (random weights; the last block's patch tokens, float32) over
``--images`` random 224 px images is written once; then, side by side (rounds rotated as in
benchmarks/capture.py), each trains a TopK autoencoder (``--expansion`` x width latents, ``--k``,
batches of ``--rows`` rows, Adam) for ``--epochs`` passes over the rows:
  overcomplete  overcomplete.sae.TopKSAE (linear encoder) with its train_sae, its AuxK loss and
                a shuffling DataLoader over the rows in memory (it trains on tensors it is given)
  vizkit        vk.train_sae(store): rows read from the store's memory-mapped files in shuffled
                blocks, AuxK on dead latents, decoder rows renormalized every step
  vizkit-rows   vk.train_sae(rows): the same on the rows in memory (what reading costs)
Usage: python benchmarks/sae.py [--images 64] [--rows 4096] [--expansion 8] [--k 32]
       [--epochs 2] [--repeats 3] [--model deit_small_patch16_224] [--device cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import statistics
import tempfile
from pathlib import Path

import torch
from timing import add_device_options, device_name, rotated_rounds

import vizkit as vk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--rows", type=int, default=4096, help="rows per training step")
    parser.add_argument("--expansion", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--k", type=int, default=32, help="latents kept per row")
    parser.add_argument("--model", default="deit_small_patch16_224",
                        help="timm model whose last block is stored (width 384; deit_base_"
                             "patch16_224: 768; vit_large_patch16_224: 1,024)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    args = add_device_options(parser).parse_args()
    torch.manual_seed(0)
    model = vk.create_model(args.model).eval().to(args.device)
    images = torch.randn(args.images, 3, 224, 224)
    folder = Path(tempfile.mkdtemp(prefix="vizkit-sae-bench-"))
    store = vk.cache_activations(model, images, folder / "s", layers=-1, progress=False)
    rows = store.rows(0, len(store))
    tokens = args.epochs * (len(store) // args.rows) * args.rows
    settings = dict(kind="topk", expansion=args.expansion, k=args.k, tokens=tokens,
                    batch_size=args.rows, device=args.device, progress=False)  # fmt: skip
    runs = {
        "overcomplete": lambda: _overcomplete(rows, args),
        "vizkit": lambda: vk.train_sae(store, **settings),
        "vizkit-rows": lambda: vk.train_sae(rows, **settings),
    }
    times, _ = rotated_rounds(runs, args.repeats, args.device, untimed=1)
    print(f"{store!r}; {tokens:,} rows per run ({args.epochs} epochs), batches of {args.rows}, "
          f"{args.expansion * store.width} latents, k={args.k}; {device_name(args.device)}, torch "
          f"{torch.__version__}; median of {args.repeats} rounds")  # fmt: skip
    base = statistics.median(times["overcomplete"])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"{name:<13} {tokens / median:12,.0f} tokens/s  {base / median:5.2f}x overcomplete")
    shutil.rmtree(folder)


def _overcomplete(rows: torch.Tensor, args: argparse.Namespace) -> None:
    from overcomplete.sae import TopKSAE, train_sae
    from overcomplete.sae.losses import top_k_auxiliary_loss

    sae = TopKSAE(rows.shape[1], args.expansion * rows.shape[1], top_k=args.k, device=args.device)
    loader = torch.utils.data.DataLoader(rows, batch_size=args.rows, shuffle=True, drop_last=True)
    optimizer = torch.optim.Adam(sae.parameters(), lr=2e-4)
    with contextlib.redirect_stdout(io.StringIO()):
        train_sae(sae, loader, top_k_auxiliary_loss, optimizer, nb_epochs=args.epochs,
                  monitoring=0, device=args.device)  # fmt: skip


if __name__ == "__main__":
    main()
