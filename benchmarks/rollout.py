"""Rollout and gradient-weighted rollout cost, side by side, as ratios to a plain forward.

vit_small_patch14_reg4_dinov2 (random weights; pass --model for another), 224 px by default:
  plain          the model's forward under torch.inference_mode (timm's fused attention on)
  rollout        vk.rollout(model, x)
  grad_rollout   vk.grad_rollout(model, x, target=3) (max_bytes lifted: at 518 px, batch 32
                 its maps and gradients take 35 GB, above the default 4 GiB guard)

Rounds as in benchmarks/capture.py; median ratio, with peak allocated GPU memory on CUDA.
Usage: python benchmarks/rollout.py [--model NAME] [--size 224] [--batch 16] [--repeats 5]
       [--device cpu|cuda] [--dtype float32|bfloat16|float16]
"""

from __future__ import annotations

import sys

import torch
from timing import build, header, parse_args, precision, print_table, rotated_rounds

import vizkit as vk


def main() -> None:
    if "--model" not in sys.argv:
        sys.argv += ["--model", "vit_small_patch14_reg4_dinov2"]
    args = parse_args(__doc__.splitlines()[0])
    model, x = build(args.model, args)

    def plain() -> None:
        with torch.inference_mode():
            model(x)

    NORM = vk.targets.embedding_norm()  # a DINOv2 backbone: no class logits
    runs = {
        "plain": plain,
        "rollout": lambda: vk.rollout(model, x),
        "grad_rollout": lambda: vk.grad_rollout(model, x, target=NORM, max_bytes=2**40),
    }
    with precision(args):
        times, faults = rotated_rounds(runs, args.repeats, args.device, untimed=1)
    print_table(times, faults, "plain", args, header(args))


if __name__ == "__main__":
    main()
