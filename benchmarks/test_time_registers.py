"""Test-time registers (issue 55, item 4): whether the zoo's models write high-norm artifact
tokens (their largest patch norm over the image's median, per block, on the Shapes sample), and
on the ViT with a planted register neuron: the neuron's rank and score, the attention map's
peak ratio, the artifact patch's norm and the register's, the output kept, the deletion and
insertion AUCs of the class token's attention without and with the register, and the time of
each step.

Usage: python benchmarks/test_time_registers.py [--images 64] [--steps 8]
"""

from __future__ import annotations

import argparse
import time

import torch

from vizkit import zoo
from vizkit.analysis import token_norms
from vizkit.datasets import load_sample
from vizkit.models import image_tower
from vizkit.text import (
    PLANTED_NEURON,
    bright_patch_images,
    planted_register_vit,
    register_effect,
    register_neurons,
)

ZOO = ("vit_tiny_shapes", "vit_deep_shapes", "cait_tiny_shapes", "clip_shapes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64, help="planted-model images")
    parser.add_argument("--steps", type=int, default=8, help="deletion / insertion steps")
    args = parser.parse_args()
    sample = load_sample()[0]
    print(f"largest patch norm / median, per block (max over {len(sample)} Shapes images):")
    for name in ZOO:
        model = zoo.load(name)[0]
        model = image_tower(model) if name == "clip_shapes" else model
        norms = token_norms(model, sample).patches.flatten(2)  # (B, L, Np)
        ratio = (norms.amax(-1) / norms.median(-1).values).amax(0)
        print(f"  {name}: {' '.join(f'{r:.1f}' for r in ratio.tolist())}")
    model = planted_register_vit()
    x, where = bright_patch_images(args.images)
    start = time.perf_counter()
    found = register_neurons(model, x, top_k=5, progress=False)
    found_s = time.perf_counter() - start
    planted = (f"blocks.{PLANTED_NEURON[0]}", PLANTED_NEURON[1])
    print(f"planted neuron {planted}: rank {found.neurons.index(planted) + 1} of "
          f"{found.scores.numel()}, score {found.neuron_scores[0]:.2f} (next "
          f"{found.neuron_scores[1]:.2f}); {found.with_outliers} of {found.images} images with "
          f"outliers, {found.outliers:.1f} per image ({found_s:.2f} s)")  # fmt: skip
    start = time.perf_counter()
    effect = register_effect(model, x, found.by_block(), steps=args.steps)
    effect_s = time.perf_counter() - start
    rows = torch.arange(len(x))
    peak = effect.peak_ratio().median(1).values
    artifact = effect.norms.flatten(2)[:, rows, where].median(1).values
    print(f"attention peak / median (median over images): {peak[0]:.1f} -> {peak[1]:.1f}")
    print(f"bright patch norm: {artifact[0]:.1f} -> {artifact[1]:.1f}; register norm "
          f"{effect.register_norms.median():.1f}; class-token attention on the register "
          f"{effect.register_attention.median():.3f}")  # fmt: skip
    print(f"output cosine {effect.output_cosine.mean():.4f}, prediction kept "
          f"{effect.agreement.float().mean():.0%}")  # fmt: skip
    deletion, insertion = effect.deletion.mean(1).tolist(), effect.insertion.mean(1).tolist()
    print(f"deletion AUC {deletion[0]:.3f} -> {deletion[1]:.3f} (lower is more faithful), "
          f"insertion AUC {insertion[0]:.3f} -> {insertion[1]:.3f} ({effect_s:.2f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
