"""Peak allocated CPU memory of an analysis, from the profiler's allocation events (every
allocation the CPU allocator serves, a kernel's own copies included): the CPU's stand-in for
`torch.cuda.max_memory_allocated`, at a GPU row's shape.

    python benchmarks/live_peak.py              # rollout, DINOv2-S reg4, 518 px, batch 1
    python benchmarks/live_peak.py --analysis grad_rollout --size 224
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import timm
import torch

import vizkit as vk

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from allocation_oracle import allocated_peak  # noqa: E402

ANALYSES = {
    "rollout": lambda model, x: vk.rollout(model, x),
    "grad_rollout": lambda model, x: vk.grad_rollout(model, x, target=3, max_bytes=2**40),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--analysis", choices=sorted(ANALYSES), default="rollout")
    parser.add_argument("--model", default="vit_small_patch14_reg4_dinov2")
    parser.add_argument("--size", type=int, default=518)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = timm.create_model(args.model, img_size=args.size).eval()
    x = torch.randn(args.batch, 3, args.size, args.size)
    ANALYSES[args.analysis](model, x)  # once before measuring: lazily built buffers
    peak = allocated_peak(lambda: ANALYSES[args.analysis](model, x))
    print(f"{args.analysis} {args.model} {args.size} px batch {args.batch}: peak allocated "
          f"{peak / 2**20:.2f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
