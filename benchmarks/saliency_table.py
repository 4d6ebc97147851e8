"""Which saliency method localizes best? compare_saliency on the shipped Shapes models.

Runs every applicable method on the committed 64-image sample (vizkit/datasets/shapes_sample.npz) of
vit_tiny_shapes and cait_tiny_shapes, explaining the true class, and prints one markdown table per
model: deletion/insertion AUC (patch level, zero/blur baselines) and, against the object masks,
pointing game, energy in the mask and IoU of the top region (mask-sized); seconds: each method's
maps and their scoring. --steps sets the curves' steps (default: compare_saliency's, 16).
Usage: python benchmarks/saliency_table.py [--level patch|pixel] [--steps 64] [--device cuda]
       [--dtype bfloat16]
"""

from __future__ import annotations

import argparse

import torch
from timing import add_device_options, device_name, precision, record

import vizkit as vk
from vizkit.datasets import load_sample

INPUT_METHODS = ["gradcam", "integrated_gradients", "saliency", "occlusion", "random"]
METHODS = {
    "vit_tiny_shapes": ["rollout", "grad_rollout", "class_attention", *INPUT_METHODS],
    "cait_tiny_shapes": [
        ("rollout (abs rows)", lambda hm, x, t: vk.rollout(hm, x, allow_non_stochastic=True)),
        "class_attention",
        *INPUT_METHODS,
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="patch", choices=["patch", "pixel"])
    parser.add_argument("--steps", type=int, default=None, help="steps of each curve")
    args = add_device_options(parser).parse_args()
    torch.manual_seed(0)
    images, labels, masks = load_sample()
    for name, methods in METHODS.items():
        model, card = vk.zoo.load(name)
        with precision(args):
            table = vk.compare_saliency(
                model.to(args.device), images, methods=methods, masks=masks, target=labels,
                level=args.level, steps=args.steps, progress=False,
            )  # fmt: skip
        title = (
            f"{name} (test accuracy {card['test_accuracy']:.3f}), 64 sample images, "
            f"{args.level} level, curves of {table.options['steps']} steps, {args.dtype}, "
            f"{device_name(args.device)}"
        )
        print(f"\n{title}")
        print(table.to_markdown())
        print("best: " + ", ".join(f"{m} {table.best(m)}" for m in table.metrics))
        if args.record:
            columns, *rows = [
                [cell.strip() for cell in line.strip("|").split("|")]
                for line in table.to_markdown().splitlines()
                if line.startswith("|") and not line.startswith("|---")
            ]
            print(f"recorded in {record(args, title, columns, rows)}")


if __name__ == "__main__":
    main()
