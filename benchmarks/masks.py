"""The cost of a learned attention mask: one training step (forward + backward) of the same ViT
with no mask, an ELM and a GMM, side by side in one run, as ratios to the baseline.

vizkit_{gap,elm,gmm}_vit_{config} (random weights), batch of 32 px images:
  vit           the baseline, timm's fused attention (scaled_dot_product_attention)
  vit unfused   the baseline with fused attention off: the masked layers' explicit softmax path
  elm, gmm      the masked models (the GMM builds its K x H Gaussians every step)

The paper lists identical MACs for base and GMM models ("for free"); the mask itself costs
K * H * Np^2 exponentials per layer, and the explicit (unfused) attention it needs costs more.
Usage: python benchmarks/masks.py [--config tiny] [--batch 64] [--repeats 5] [--device cpu]
       [--dtype float32|bfloat16|float16]
"""

from __future__ import annotations

import argparse

import timm
import torch
from timing import (
    add_device_options,
    device_name,
    precision,
    print_table,
    rotated_rounds,
    train_step,
)

import vizkit  # noqa: F401  (registers the vizkit_* models)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = add_device_options(parser).parse_args()
    torch.manual_seed(0)
    models = {
        "vit": timm.create_model(f"vizkit_gap_vit_{args.config}"),
        "vit unfused": timm.create_model(f"vizkit_gap_vit_{args.config}"),
        "elm": timm.create_model(f"vizkit_elm_vit_{args.config}"),
        "gmm": timm.create_model(f"vizkit_gmm_vit_{args.config}"),
    }
    for module in models["vit unfused"].modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    size = models["vit"].pretrained_cfg["input_size"][-1]
    x = torch.randn(args.batch, 3, size, size, device=args.device)
    y = torch.randint(0, models["vit"].num_classes, (args.batch,), device=args.device)
    runs = {name: train_step(model.to(args.device), x, y) for name, model in models.items()}
    with precision(args):
        times, faults = rotated_rounds(runs, args.repeats, args.device)
    title = (
        f"vizkit_*_vit_{args.config}, batch {args.batch}, {size} px, forward + backward, "
        f"{args.dtype}, {device_name(args.device)}, torch {torch.__version__}; median of "
        f"{args.repeats} rounds"
    )
    print_table(times, faults, "vit", args, title)


if __name__ == "__main__":
    main()
