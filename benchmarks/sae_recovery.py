"""Planted-dictionary recovery: sparse autoencoders trained on rows that are k-sparse positive
combinations of known unit directions, and how many of those directions they find.

``--directions`` random unit directions in ``--width`` dimensions; each of ``--rows`` rows
combines k=3 of them with weights uniform in [0.5, 2.5]. Each kind trains with expansion 4
(4 x width latents), k=3 (TopK, BatchTopK, Matryoshka) or the default L1 (ReLU), batches of
512, 10 epochs,
over ``--seeds`` seeds (data and autoencoder seeded alike). A direction is recovered when some
decoder row has cosine above 0.9 with it; the table gives the recovered fraction, the mean and
the smallest best cosine, and the FVU and L0 on the rows.
Usage: python benchmarks/sae_recovery.py [--seeds 3] [--rows 30000] [--width 32] [--directions 64]
"""

from __future__ import annotations

import argparse

import vizkit as vk
from vizkit.sae.synthetic import planted_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=30_000)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--directions", type=int, default=64)
    args = parser.parse_args()
    print(f"{args.directions} planted directions in {args.width} dimensions, k=3, "
          f"{args.rows:,} rows, {args.seeds} seeds")  # fmt: skip
    print(f"{'kind':<10} {'seed':>4} {'recovered':>9} {'mean cos':>8} {'min cos':>8} "
          f"{'FVU':>6} {'L0':>5}")  # fmt: skip
    for kind in ("topk", "batchtopk", "relu", "matryoshka"):
        for seed in range(args.seeds):
            rows, dictionary = planted_rows(seed, args.rows, args.width, args.directions)
            sae = vk.train_sae(rows, kind=kind, expansion=4, k=3, tokens=10 * len(rows),
                               batch_size=512, seed=seed, progress=False)  # fmt: skip
            best = (dictionary @ sae.W_dec.detach().T).max(dim=1).values
            scores = vk.sae.evaluate_sae(sae, rows, progress=False)
            print(f"{kind:<10} {seed:>4} {float((best > 0.9).float().mean()):>9.1%} "
                  f"{float(best.mean()):>8.3f} {float(best.min()):>8.3f} {scores.fvu:>6.3f} "
                  f"{scores.l0:>5.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
