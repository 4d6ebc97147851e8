"""What a saliency comparison costs: wall seconds of `compare_saliency` at its default curve steps
and at steps=64 (the heavier setting, vizkit 0.1's default), and of `SaliencyComparer` until it
appears, on a random-init ViT-S with two 224 px images (issue 32's setting); each method's seconds
(maps and scoring) and their sum against the wall time.

Usage: python benchmarks/saliency_cost.py [--model vit_small_patch16_224] [--batch 2]
       [--repeats 3] [--device cuda] [--record]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

from timing import add_device_options, build, header, precision, record

import vizkit as vk
from vizkit.widgets import SaliencyComparer

RUNS: dict[str, Callable] = {
    "compare_saliency()": lambda m, x: vk.compare_saliency(m, x, progress=False),
    "compare_saliency(steps=64)": lambda m, x: vk.compare_saliency(m, x, steps=64, progress=False),
    "SaliencyComparer()": lambda m, x: SaliencyComparer(m, x, progress=False),
    "SaliencyComparer(steps=16)": lambda m, x: SaliencyComparer(m, x, steps=16, progress=False),
}


def rounds(model, x, repeats: int) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Wall seconds of each run per round, the order rotated each round; the last outputs."""
    times: dict[str, list[float]] = {name: [] for name in RUNS}
    last: dict[str, object] = {}
    order = list(RUNS)
    for round_ in range(repeats):
        shift = round_ % len(order)
        for name in order[shift:] + order[:shift]:
            start = time.perf_counter()
            last[name] = RUNS[name](model, x)
            times[name].append(time.perf_counter() - start)
    return times, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=224, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=3)
    args = add_device_options(parser).parse_args()
    model, x = build(args.model, args)
    warnings.simplefilter("ignore")  # the random-init model's tables warn: near chance
    with precision(args):
        vk.compare_saliency(model, x[:1], ["random"], steps=1, progress=False)  # warm-up
        times, last = rounds(model, x, args.repeats)
    title = header(args, extra=", one timed call per run and round")
    print(title)
    base = statistics.median(times["compare_saliency(steps=64)"])
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        table = last[name] if hasattr(last[name], "seconds") else last[name].table(0)
        steps = table.options["steps"]
        summed = sum(s for s in table.seconds if s == s)
        rows.append([name, steps, f"{median:.2f}", f"{median / base:.2f}x",
                     f"{min(values):.2f}..{max(values):.2f}", f"{summed:.2f}"])  # fmt: skip
        per_method = ", ".join(
            f"{m} {s:.2f}" for m, s in zip(table.methods, table.seconds, strict=True)
        )
        print(f"{name:<28} steps {steps:>3}  median {median:6.2f} s  "
              f"({median / base:.2f}x of steps=64)  seconds column: {per_method}")  # fmt: skip
    if args.record:
        columns = ["run", "steps", "median s", "ratio to steps=64", "range s",
                   "sum of the seconds column (last round)"]  # fmt: skip
        print(f"recorded in {record(args, title, columns, rows)}")


if __name__ == "__main__":
    main()
