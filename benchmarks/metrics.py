"""The metrics' cost per perturbed image against a plain batched forward of as many images (the
limit: a metric cannot cost less than the images it must run), beside Quantus 0.6 on the same
model, images and maps.

Model: the shipped vit_tiny_shapes; images: the Shapes sample (32 x 32); maps: AttnLRP's.
Pairs: deletion at pixel level (32 steps) / Quantus' PixelFlipping (32 pixels a step),
faithfulness correlation (50 subsets of 10 % of the units) / Quantus' FaithfulnessCorrelation
(50 subsets of 10 % of the pixels); ROAD at 9 removal shares and average drop alone (Quantus'
ROAD raises an IndexError on 3-channel images: it expands the attributions to the image's
channels and then indexes one channel's pixels with them).
Each round runs every entry once, order rotated; the median over rounds is reported.
Usage: python benchmarks/metrics.py [--images 32] [--repeats 3] [--device cpu] [--record]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import quantus
import torch
from timing import add_device_options, device_name, record, rotated_rounds

import vizkit as vk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = add_device_options(parser).parse_args()
    model, _ = vk.zoo.load("vit_tiny_shapes")
    model = model.eval().to(args.device)
    x, labels, _ = vk.datasets.load_sample()
    x, labels = x[: args.images].to(args.device), labels[: args.images].to(args.device)
    maps = vk.attnlrp(model, x, target=labels).maps
    n, side = len(x), x.shape[-1]
    pixels = side * side
    a = maps[:, None].cpu().numpy()
    xs, ys = x.cpu().numpy(), labels.cpu().numpy()

    def quantus_call(metric):
        return lambda: metric(model=model, x_batch=xs, y_batch=ys, a_batch=a,
                              device=args.device, channel_first=True)  # fmt: skip

    quiet = {"disable_warnings": True, "display_progressbar": False}
    entries = {  # name -> (perturbed images, call)
        "vizkit deletion (pixel, 32 steps)": (
            n * 31,
            lambda: vk.metrics.deletion(
                model, x, maps, labels, level="pixel", steps=32, progress=False
            ),  # fmt: skip
        ),
        "Quantus PixelFlipping (32 px a step)": (
            n * pixels // 32,
            quantus_call(
                quantus.PixelFlipping(features_in_step=32, perturb_baseline="black", **quiet)
            ),  # fmt: skip
        ),
        "vizkit road (9 shares)": (n * 9, lambda: vk.metrics.road(model, x, maps, labels)),
        "vizkit faithfulness_correlation (50)": (
            n * 50,
            lambda: vk.metrics.faithfulness_correlation(model, x, maps, labels, runs=50),
        ),
        "Quantus FaithfulnessCorrelation (50)": (
            n * 50,
            quantus_call(
                quantus.FaithfulnessCorrelation(
                    nr_runs=50, subset_size=pixels // 10, perturb_baseline="black", **quiet
                )
            ),
        ),  # fmt: skip
        "vizkit average_drop (whole and dimmed)": (
            2 * n,
            lambda: vk.metrics.average_drop(model, x, maps, labels),
        ),
    }
    runs = {name: call for name, (_, call) in entries.items()}
    chunk = 256
    for count in sorted({images for images, _ in entries.values()}):
        copies = x.repeat(count // n + 1, 1, 1, 1)[:count]

        def forward(copies=copies, chunk=chunk):
            with torch.no_grad():
                for part in copies.split(chunk):
                    model(part)

        runs[f"forward {count} images"] = forward
    times, _ = rotated_rounds(runs, args.repeats, args.device, untimed=1)
    title = (
        f"Metrics on vit_tiny_shapes, {n} Shapes images of {side} px, AttnLRP maps, "
        f"{device_name(args.device)}, torch {torch.__version__}, Quantus {quantus.__version__}; "
        f"median of {args.repeats} rounds"
    )
    print(title)
    columns = ["metric", "images run", "median ms", "µs per image", "x forward"]
    rows = []
    for name, (count, _) in entries.items():
        ms = statistics.median(times[name]) * 1e3
        forward_ms = statistics.median(times[f"forward {count} images"]) * 1e3
        rows.append([name, f"{count:,}", f"{ms:.1f}", f"{ms * 1e3 / count:.0f}",
                     f"{ms / forward_ms:.2f}x"])  # fmt: skip
    for count in sorted({images for images, _ in entries.values()}):
        ms = statistics.median(times[f"forward {count} images"]) * 1e3
        rows.append([f"forward {count} images", f"{count:,}", f"{ms:.1f}",
                     f"{ms * 1e3 / count:.0f}", "1.00x"])  # fmt: skip
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    for row in [columns, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    if args.record:
        print(f"recorded in {record(args, title, columns, rows)}")


if __name__ == "__main__":
    np.seterr(all="ignore")  # Quantus' correlations of constant runs
    main()
