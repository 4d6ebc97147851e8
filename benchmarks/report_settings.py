"""What the report's quick saliency settings cost in accuracy: the scores of `vizkit report`'s
comparison (curves of `CURVE_STEPS` steps, integrated gradients of `IG_STEPS` steps) against
`compare_saliency`'s defaults (16 curve steps, integrated gradients of 50 steps), on a trained
zoo model and its own images, where the scores mean something: each metric's largest change
over the methods, and the methods' order under each.

Usage: python benchmarks/report_settings.py [--model vit_tiny_shapes] [--n 16] [--record]
"""

from __future__ import annotations

import argparse
import warnings

from timing import record

import vizkit as vk
from vizkit.report.sections.saliency import CURVE_STEPS
from vizkit.report.sections.saliency_methods import IG_STEPS

METHODS = ["rollout", "class_attention", "gradcam", "random"]


def integrated_gradients(steps: int):
    """The integrated-gradients method of ``steps`` steps, named as `compare_saliency` names it."""

    def run(hm, x, targets):
        return vk.integrated_gradients(hm, x, targets, n_steps=steps)

    return ("integrated_gradients", run)


def order(table, metric: str) -> str:
    """The methods from best to worst by ``metric`` (NaN rows, methods that do not apply, out)."""
    j = table.metrics.index(metric)
    values = table.mean[:, j]
    better_high = vk.metrics.METRICS[metric].higher
    ranked = sorted(
        (i for i in range(len(table.methods)) if not values[i].isnan()),
        key=lambda i: -values[i] if better_high else values[i],
    )
    return " > ".join(table.methods[i] for i in ranked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_tiny_shapes")
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--record", action="store_true", help="also write docs/benchmark_results/")
    args = parser.parse_args()
    args.device, args.dtype, args.repeats = "cpu", "float32", 1
    warnings.simplefilter("ignore")
    model, card = vk.zoo.load(args.model)
    batch = vk.datasets.model_batch(model, None, args.n, card)
    settings = {
        "defaults": (16, 50),
        "report": (CURVE_STEPS, IG_STEPS),
    }
    tables = {
        name: vk.compare_saliency(
            model, batch.images, [*METHODS, integrated_gradients(ig)], batch.masks,
            steps=steps, progress=False,
        )
        for name, (steps, ig) in settings.items()
    }  # fmt: skip
    title = (f"{args.model}, {batch.source}: the report's settings (curves {CURVE_STEPS} steps, "
             f"integrated gradients {IG_STEPS}) against the defaults (16, 50)")  # fmt: skip
    print(title)
    rows = []
    for metric in tables["defaults"].metrics:
        j = tables["defaults"].metrics.index(metric)
        change = (tables["report"].mean[:, j] - tables["defaults"].mean[:, j]).abs()
        ranks = [order(tables[name], metric) for name in settings]
        rows.append([metric, f"{float(change.nanmean()):.4f}",
                     f"{float(change[~change.isnan()].max()):.4f}", *ranks])  # fmt: skip
        print("  ".join(rows[-1]))
    if args.record:
        columns = ["metric", "mean abs. change", "max abs. change", "order, defaults",
                   "order, report"]  # fmt: skip
        print(f"recorded in {record(args, title, columns, rows)}")


if __name__ == "__main__":
    main()
