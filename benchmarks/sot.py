"""The cost of svPN (Table 4c's speed column, on CPU): exact svPN through an SVD against the
fast version (power iteration, (#sv, #iter) = (1, 1) and (1, 3)) and no normalization, side by
side in one run, as ratios to no normalization.

--what matrices: forward + backward of the normalization alone on a batch of B x h matrices
                 of m x m (default B 64, h 6, m 14: SoT-Tiny's head on 64 images).
--what model:    one training step of vizkit_sot_micro (32 px, batch 64) with each
                 normalization (the paper's Hz are whole-model throughputs on a GPU).
Usage: python benchmarks/sot.py [--what matrices] [--m 14] [--repeats 5] [--device cpu]
       [--dtype float32|bfloat16|float16]
"""

from __future__ import annotations

import argparse

import timm
import torch
from timing import (
    add_device_options,
    device_name,
    precision,
    print_table,
    rotated_rounds,
    train_step,
)

import vizkit  # noqa: F401  (registers the vizkit_* models)
from vizkit.papers.sot import svpn, svpn_approx

NORMS = {"none": {"norm": "none"}, "approx 1,1": {"norm": "approx"},
         "approx 1,3": {"norm": "approx", "num_iter": 3}, "svd": {"norm": "exact"}}  # fmt: skip


def matrix_runs(batch: int, heads: int, m: int, device: str) -> dict:
    q = torch.randn(batch * heads, m, m, device=device, requires_grad=True)
    v0 = torch.randn(m, device=device)

    def run(normalize):
        def step() -> None:
            q.grad = None
            normalize(q).square().sum().backward()

        return step

    return {
        "none": run(lambda t: t),
        "approx 1,1": run(lambda t: svpn_approx(t, v0, 0.5)[0]),
        "approx 1,3": run(lambda t: svpn_approx(t, v0, 0.5, num_iter=3)[0]),
        "svd": run(lambda t: svpn(t, 0.5)),
    }


def model_runs(batch: int, device: str) -> dict:
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    runs = {}
    for name, kwargs in NORMS.items():
        torch.manual_seed(0)
        model = timm.create_model("vizkit_sot_micro", **kwargs).to(device)
        runs[name] = train_step(model, x, y)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", choices=("matrices", "model"), default="matrices")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--m", type=int, default=14)
    parser.add_argument("--repeats", type=int, default=5)
    args = add_device_options(parser).parse_args()
    torch.manual_seed(0)
    if args.what == "matrices":
        runs = matrix_runs(args.batch, args.heads, args.m, args.device)
        what = f"{args.batch} x {args.heads} matrices of {args.m} x {args.m}"
    else:
        runs = model_runs(args.batch, args.device)
        what = f"vizkit_sot_micro training step, batch {args.batch}"
    with precision(args):
        times, faults = rotated_rounds(runs, args.repeats, args.device)
    title = (f"{what}, forward + backward, {args.dtype}, {device_name(args.device)}, torch "
             f"{torch.__version__}; median of {args.repeats} rounds")  # fmt: skip
    print_table(times, faults, "approx 1,1", args, title)


if __name__ == "__main__":
    main()
