"""Reading the next batch in a thread, on the device at hand: `vk.cka_matrix` and `vk.evaluate`
with the thread (`vizkit.prefetch.prefetched`) and without it, side by side in one process, the
order rotated each round. vizkit reads ahead only for a model on an accelerator
(`vizkit.prefetch.read_ahead`); this is the measurement behind that rule.

Two tables, each a ratio to its first row:
  cka       the plain forward over the loader (inference mode), then `cka_matrix` (every
            block's output) without and with the thread
  evaluate  deletion + insertion AUC of the chance-level method, without and with the thread
Random-init timm models, seeded random images; --dtype bfloat16/float16 runs both under autocast.
Usage: python benchmarks/read_ahead.py [--images 256] [--batch 32] [--eval-images 32]
       [--repeats 3] [--device cpu] [--record]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import timm
import torch
from timing import add_device_options, device_name, precision, print_table, rotated_rounds
from torch.utils.data import DataLoader, TensorDataset

import vizkit as vk
import vizkit.prefetch


def threaded(run: Callable[[], object], thread: bool) -> Callable[[], None]:
    """``run`` with the reading thread forced on or off, whatever the model's device."""

    def call() -> None:
        decide = vizkit.prefetch.model_device
        device = torch.device("cuda" if thread else "cpu")
        vizkit.prefetch.model_device = lambda model: device  # only what read_ahead decides by
        try:
            run()
        finally:
            vizkit.prefetch.model_device = decide

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--eval-images", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = add_device_options(parser).parse_args()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    model = timm.create_model("deit_tiny_patch16_224").eval().to(args.device)
    x = torch.randn(args.images, 3, 224, 224, generator=generator)
    loader = DataLoader(TensorDataset(x), batch_size=args.batch)

    def forward() -> None:
        with torch.inference_mode():
            for (images,) in loader:
                model(images.to(args.device))

    def cka() -> None:
        vk.cka_matrix(model, loader, progress=False)

    where = f"{device_name(args.device)}, torch {torch.__version__}"
    title = (f"read ahead: cka_matrix, deit_tiny (random weights), {args.images} images, batch "
             f"{args.batch}, {where}; median of {args.repeats} rounds")  # fmt: skip
    runs = {"forward": forward, "cka": threaded(cka, False), "cka+thread": threaded(cka, True)}
    with precision(args):
        measured = rotated_rounds(runs, args.repeats, args.device, untimed=0)
    print_table(*measured, "forward", args, title)

    classifier = timm.create_model("vit_tiny_patch16_224", num_classes=10).eval()
    classifier = classifier.to(args.device)
    images = torch.randn(args.eval_images, 3, 224, 224, generator=generator)
    data = TensorDataset(images, torch.randint(0, 10, (args.eval_images,), generator=generator))
    options = {"methods": ["random"], "metrics": ["deletion_auc", "insertion_auc"],
               "batch_size": 8, "progress": False}  # fmt: skip

    def evaluate() -> None:
        vk.evaluate(classifier, data, **options)

    title = (f"read ahead: vk.evaluate, vit_tiny (random weights), {args.eval_images} images, "
             f"batch 8, deletion + insertion AUC, {where}; median of {args.repeats} "
             "rounds")  # fmt: skip
    runs = {"evaluate": threaded(evaluate, False), "evaluate+thread": threaded(evaluate, True)}
    with precision(args):
        measured = rotated_rounds(runs, args.repeats, args.device, untimed=0)
    print_table(*measured, "evaluate", args, title)


if __name__ == "__main__":
    main()
