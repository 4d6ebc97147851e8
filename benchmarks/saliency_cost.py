"""What a saliency comparison costs: `compare_saliency` at its default curve steps and at steps=64
(the heavier setting, vizkit 0.1's default), and `SaliencyComparer` until it appears, at its 8
steps and at 16 (0.1's), on a random-init ViT-S with two 224 px images (issue 32's setting).
Each run's wall and process CPU seconds (medians of rotated rounds) and the images it sends
through the model, which no other load on the machine changes; each method's seconds (maps and
scoring) and their sum against the wall time.

Usage: python benchmarks/saliency_cost.py [--model vit_small_patch16_224] [--batch 2]
       [--repeats 3] [--threads 1] [--device cuda] [--record]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from timing import add_device_options, build, header, precision, record

import vizkit as vk
from vizkit.widgets import SaliencyComparer

# run -> (call, the run with vizkit 0.1's default it is compared with)
RUNS: dict[str, tuple[Callable, str]] = {
    "compare_saliency()": (
        lambda m, x: vk.compare_saliency(m, x, progress=False),
        "compare_saliency(steps=64)",
    ),
    "compare_saliency(steps=64)": (
        lambda m, x: vk.compare_saliency(m, x, steps=64, progress=False),
        "compare_saliency(steps=64)",
    ),
    "SaliencyComparer()": (
        lambda m, x: SaliencyComparer(m, x, progress=False),
        "SaliencyComparer(steps=16)",
    ),
    "SaliencyComparer(steps=16)": (
        lambda m, x: SaliencyComparer(m, x, steps=16, progress=False),
        "SaliencyComparer(steps=16)",
    ),
}
COSTS = ("wall s", "CPU s", "forward images")


def measured(run: Callable, model, x) -> tuple[dict[str, float], object]:
    """Wall and process CPU seconds of ``run(model, x)`` and the images it sent through the
    model (a count no other process on the machine changes), and its output."""
    images = []
    handle = model.register_forward_pre_hook(lambda module, args: images.append(len(args[0])))
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        out = run(model, x)
    finally:
        handle.remove()
    cost = [time.perf_counter() - wall, time.process_time() - cpu, sum(images)]
    return dict(zip(COSTS, cost, strict=True)), out


def rounds(model, x, repeats: int) -> tuple[dict[str, list[dict]], dict[str, object]]:
    """The costs of each run per round, the order rotated each round; the last outputs."""
    costs: dict[str, list[dict]] = {name: [] for name in RUNS}
    last: dict[str, object] = {}
    order = list(RUNS)
    for round_ in range(repeats):
        shift = round_ % len(order)
        for name in order[shift:] + order[:shift]:
            cost, last[name] = measured(RUNS[name][0], model, x)
            costs[name].append(cost)
    return costs, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=224, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    args = add_device_options(parser).parse_args()
    if args.threads:  # 1 on a shared machine: two processes' spinning threads slow both a lot
        torch.set_num_threads(args.threads)
    model, x = build(args.model, args)
    warnings.simplefilter("ignore")  # the random-init model's tables warn: near chance
    with precision(args):
        vk.compare_saliency(model, x[:1], ["random"], steps=1, progress=False)  # warm-up
        costs, last = rounds(model, x, args.repeats)
    title = header(args, extra=", one timed call per run and round; ratios to vizkit 0.1's default")
    print(title)
    median = {n: {k: statistics.median(c[k] for c in cs) for k in COSTS} for n, cs in costs.items()}
    rows = []
    for name, cost in median.items():
        base = median[RUNS[name][1]]
        table = last[name] if hasattr(last[name], "seconds") else last[name].table(0)
        cells = [
            f"{cost[k]:.{int(k != 'forward images')}f} ({cost[k] / base[k]:.2f}x)" for k in COSTS
        ]
        summed = sum(s for s in table.seconds if s == s)
        rows.append([name, table.options["steps"], *cells, f"{summed:.1f}"])
        per_method = ", ".join(
            f"{m} {s:.1f}" for m, s in zip(table.methods, table.seconds, strict=True)
        )
        print(f"{name:<28} steps {rows[-1][1]:>3}  " + "  ".join(
            f"{k} {c}" for k, c in zip(COSTS, cells, strict=True)
        ) + f"  seconds column (last round): {per_method}")  # fmt: skip
    if args.record:
        columns = ["run", "steps", *COSTS, "seconds column sum (last round)"]
        print(f"recorded in {record(args, title, columns, rows)}")


if __name__ == "__main__":
    main()
