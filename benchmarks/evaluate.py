"""`vk.evaluate` against the forwards its curves need: deletion and insertion AUC over a data
set with the chance-level method ("random": its maps cost nothing, so what remains is the
evaluation), beside plain inference forwards of as many images as the evaluation sent through
the model (counted with a hook), in passes of the size it used. The ratio is the evaluation's
own overhead: loading, perturbing, scoring, bookkeeping. Random-init timm model, random images.

Usage: python benchmarks/evaluate.py [--model vit_tiny_patch16_224] [--images 64] [--batch 16]
       [--size 224] [--repeats 3] [--device cpu] [--record]
"""

from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch
from timing import add_device_options, device_name, print_and_record
from torch.utils.data import TensorDataset

import vizkit as vk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_tiny_patch16_224")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    args = add_device_options(parser).parse_args()
    torch.manual_seed(0)
    model = timm.create_model(args.model, img_size=args.size, num_classes=10).eval()
    model = model.to(args.device)
    x = torch.randn(args.images, 3, args.size, args.size)
    data = TensorDataset(x, torch.randint(0, 10, (args.images,)))
    sizes: list[int] = []
    model.register_forward_pre_hook(lambda module, inputs: sizes.append(len(inputs[0])))
    options = {"methods": ["random"], "metrics": ["deletion_auc", "insertion_auc"],
               "batch_size": args.batch, "progress": False}  # fmt: skip

    def evaluation() -> None:
        vk.evaluate(model, data, **options)

    evaluation()  # warm-up, and the passes it runs
    passes = list(sizes)
    images = x[: max(passes)].to(args.device)

    def forwards() -> None:
        with torch.inference_mode():
            for size in passes:
                model(images[:size])

    times: dict[str, list[float]] = {"forwards": [], "evaluate": []}
    for round_ in range(args.repeats):
        for name, run in sorted({"forwards": forwards, "evaluate": evaluation}.items(),
                                reverse=bool(round_ % 2)):  # fmt: skip
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    title = (f"vk.evaluate, {args.model} (random weights), {args.images} images of {args.size} "
             f"px, batch {args.batch}, deletion + insertion AUC, method 'random', "
             f"{device_name(args.device)}, torch {torch.__version__}; median of {args.repeats} "
             "rounds")  # fmt: skip
    forward = statistics.median(times["forwards"])
    rows = [[name, f"{statistics.median(t):.2f}", f"{statistics.median(t) / forward:.2f}x",
             f"{sum(passes)}", f"{len(passes)}"] for name, t in times.items()]  # fmt: skip
    columns = ["run", "median s", "ratio to the forwards", "images", "passes"]
    print_and_record(args, title, columns, rows)


if __name__ == "__main__":
    main()
