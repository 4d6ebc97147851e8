"""CKA's per-batch work, in one process: the kernels and HSIC of every block output of one batch,
against the forward that made them.

deit_tiny_patch16_224 (random weights), one batch (--batch, default 16) of seeded random images:
its 12 block outputs (B x 37,824 features) are captured once; then each round times the forward
under torch.inference_mode and the kernels, their checks and `hsic_matrix` (what `cka_matrix`
adds per batch), each after one untimed call. The whole-run `benchmarks/cka.py` spawns a process per
measurement, whose noise on a small shared machine can exceed these costs.
Usage: python benchmarks/cka_kernels.py [--model deit_tiny_patch16_224] [--batch 32]
       [--repeats 7] [--device cpu] [--dtype float32]
"""

from __future__ import annotations

import statistics

import torch
from timing import build, header, parse_args, precision, record, timed

import vizkit as vk
from vizkit.analysis.cka_kernels import check_kernels, hsic_matrix, kernel


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    if args.model == "deit_small_patch16_224":  # the shared parser's default
        args.model = "deit_tiny_patch16_224"
    model, x = build(args.model, args)
    names = [f"blocks.{i}.hook_resid_post" for i in range(len(model.blocks))]
    with torch.inference_mode(), precision(args):
        _, cache = vk.HookedModel(model).run_with_cache(x, names=names)
    features = [cache[name].flatten(1) for name in names]

    def forward() -> None:
        with torch.inference_mode(), precision(args):
            model(x)

    def kernels() -> None:
        built = [kernel(f, check=False) for f in features]
        check_kernels(built)  # one read of every layer's flags, as cka_matrix does
        hsic_matrix(built, unbiased=True)

    runs = {"forward": forward, "kernels + HSIC": kernels}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            fn()
            seconds[name].append(timed(fn, args.device)[0])
    title = header(args, f"; {len(names)} layers of {features[0].shape[1]:,} features")
    print(title)
    base = statistics.median(seconds["forward"])
    rows = []
    for name, values in seconds.items():
        median = statistics.median(values)
        spread = f"{min(values) * 1e3:.1f}..{max(values) * 1e3:.1f}"
        print(f"{name:<16} {median * 1e3:8.1f} ms {median / base:6.2f}x   range {spread} ms")
        rows.append([name, f"{median * 1e3:.1f}", f"{median / base:.2f}x", spread])
    if args.record:
        columns = ["method", "median ms", "ratio to forward", "range ms"]
        print(f"recorded in {record(args, title, columns, rows)}")


if __name__ == "__main__":
    main()
