"""What a sparse autoencoder finds in the shipped Shapes ViT: for each shape class, the latent
that detects it best over held-out images, and whether it fires on the object or elsewhere.

A store of vit_tiny_shapes's last block (all tokens) over ``--train`` Shapes training images,
a TopK autoencoder on it (expansion 4, k=8, batches of 1024, 5 epochs), and a second store of
``--test`` test images (the same layer; the autoencoder is not trained on it). Per class: the
latent whose per-image maximum has the largest ROC AUC for "this image shows the class", that
AUC, and the share of its activation on patch tokens that falls on the object (patches at least
a quarter covered by the object's mask) against the object patches' share of all patches
(chance: a latent blind to the object; the rest is background and distractors). Then the
spliced-in score and the circle detector ablated on the test circles.
Usage: python benchmarks/sae_shapes.py [--train 2000] [--test 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

import vizkit as vk


def shapes(split: str, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(images, labels, masks) of ``count`` Shapes images of ``split``."""
    data = vk.datasets.Shapes(split, n=count)
    items = [data[i] for i in range(count)]
    return (torch.stack([i[0] for i in items]), torch.tensor([i[1] for i in items]),
            torch.stack([i[2] for i in items]))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, _ = vk.zoo.load("vit_tiny_shapes")
    train, (images, labels, masks) = shapes("train", args.train), shapes("test", args.test)
    folder = tempfile.mkdtemp(prefix="vizkit-sae-shapes-")
    start = time.perf_counter()
    store = vk.cache_activations(model, (train[0],), f"{folder}/train", layers=[-1],
                                 tokens="all", progress=False)  # fmt: skip
    sae = vk.train_sae(store, expansion=4, k=8, tokens=5 * len(store), batch_size=1024,
                       seed=args.seed, progress=False)  # fmt: skip
    took = time.perf_counter() - start
    test = vk.cache_activations(model, (images,), f"{folder}/test", layers=[-1], tokens="all",
                                progress=False)  # fmt: skip
    scores = vk.sae.evaluate_sae(sae, test, progress=False)
    found = vk.sae.features(sae, test, progress=False)
    detectors, share = found.class_detectors(labels), found.mask_share(masks)
    print(f"{sae} on {store.name}, {args.train} training images, seed {args.seed}: stored and "
          f"trained in {took:.0f} s; on {args.test} test images {scores}")  # fmt: skip
    print(f"{'class':<9} {'latent':>6} {'AUC':>6} {'on object':>9}   (chance {share.chance:.2f})")
    for cls, latent, auc in detectors.best():
        name = vk.datasets.SHAPE_CLASSES[cls]
        print(f"{name:<9} {latent:>6} {auc:>6.3f} {float(share.share[latent]):>9.2f}")
    on_object = sum(float(share.share[i]) > share.chance for _, i, _ in detectors.best())
    print(
        f"classes detected at AUC >= 0.9: {detectors.detected(0.9)} of 10 (>= 0.95: "
        f"{detectors.detected(0.95)}); detectors above chance on the object: {on_object} of 10"
    )
    print(vk.sae.spliced_score(model, sae, (images, labels), progress=False))
    circle = detectors.best()[0][1]
    result = vk.sae.ablate(model, sae, images[labels == 0], circle)
    before, after = result.mean_probability(0)
    print(f"ablating latent {circle} on the {len(result.clean)} test circles: mean circle "
          f"probability {before:.3f} -> {after:.3f}; {result}")  # fmt: skip


if __name__ == "__main__":
    main()
