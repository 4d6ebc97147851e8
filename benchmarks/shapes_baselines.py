"""How hard is Shapes? Generation time and a linear classifier on raw pixels.

The data set is designed so that the class cannot be read off pixel statistics (position, colour,
rotation and background vary), while a tiny ViT learns it: a linear classifier on pixels should
stay below 40% test accuracy (the zoo's ViT reaches >= 90%; see models/README.md).
Usage: python benchmarks/shapes_baselines.py [--train 50000]
"""

from __future__ import annotations

import argparse
import time

from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from vizkit.datasets import render_shapes
from vizkit.datasets.shapes import SPLIT_SIZES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=SPLIT_SIZES["train"])
    args = parser.parse_args()
    start = time.perf_counter()
    train_images, train_labels, _ = render_shapes(args.train, split="train")
    generated = time.perf_counter() - start
    test_images, test_labels, _ = render_shapes(SPLIT_SIZES["test"], split="test")
    print(f"generated {args.train} train images (32 px) in {generated:.1f} s")

    scaler = StandardScaler().fit(train_images.reshape(len(train_images), -1) / 255.0)
    x_train = scaler.transform(train_images.reshape(len(train_images), -1) / 255.0)
    x_test = scaler.transform(test_images.reshape(len(test_images), -1) / 255.0)
    start = time.perf_counter()
    linear = LogisticRegression(C=0.01, max_iter=300).fit(x_train, train_labels)
    print(
        f"linear classifier on pixels ({time.perf_counter() - start:.0f} s to fit): "
        f"train {linear.score(x_train, train_labels):.3f}, "
        f"test {linear.score(x_test, test_labels):.3f} (chance 0.100)"
    )


if __name__ == "__main__":
    main()
