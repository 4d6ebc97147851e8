"""Shared timing for the benchmarks: rotated rounds, median per method, page faults."""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import vizkit as vk


def parse_args(description: str, **defaults: str) -> argparse.Namespace:
    """The benchmarks' common command line: --model (or --models), --batch, --repeats, --device."""
    parser = argparse.ArgumentParser(description=description)
    if "models" in defaults:
        parser.add_argument("--models", default=defaults["models"], help="comma-separated")
    else:
        parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    return parser.parse_args()


def build(name: str, args: argparse.Namespace) -> tuple[nn.Module, torch.Tensor]:
    """The model (random weights, eval, on the device) and a seeded batch of 224 px images."""
    torch.manual_seed(0)
    model = vk.create_model(name).eval().to(args.device)
    x = torch.randn(args.batch, 3, 224, 224, device=args.device)
    return model, x


def deit_setup(description: str) -> tuple[argparse.Namespace, nn.Module, torch.Tensor]:
    """`parse_args` and `build` for the one-model benchmarks."""
    args = parse_args(description)
    return (args, *build(args.model, args))


def header(args: argparse.Namespace, extra: str = "", model: str | None = None) -> str:
    """One line naming the model, batch, device, threads and torch version of a run."""
    return (
        f"{model or args.model}, batch {args.batch}, 224 px, {args.device}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; median of "
        f"{args.repeats} rounds{extra}"
    )


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One forward + backward of ``model`` on (x, y) with cross-entropy (gradients reset)."""

    def run() -> None:
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    return run


def timed(fn: Callable[[], object], device: str) -> tuple[float, int]:
    """Wall seconds and minor page faults of one call."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def rotated_rounds(
    runs: dict[str, Callable[[], object]], repeats: int, device: str, untimed: int = 2
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Each round runs every method in turn, order rotated each round so drift hits them alike;
    each method gets ``untimed`` calls and then one timed call (its own steady state).

    Returns:
        seconds and page faults per method, one value per round.
    """
    times: dict[str, list[float]] = {k: [] for k in runs}
    faults: dict[str, list[int]] = {k: [] for k in runs}
    order = list(runs)
    for fn in runs.values():  # warm-up
        fn()
    for round_ in range(repeats):
        shift = round_ % len(order)
        for name in order[shift:] + order[:shift]:
            for _ in range(untimed):
                runs[name]()
            seconds, page_faults = timed(runs[name], device)
            times[name].append(seconds)
            faults[name].append(page_faults)
    return times, faults


def print_table(times: dict[str, list[float]], faults: dict[str, list[int]], base: str) -> None:
    """Median seconds per method and its ratio to ``base``."""
    reference = statistics.median(times[base])
    print(f"{'method':<12} {'median s':>9} {'ratio':>7} {'range s':>13} {'page faults/call':>17}")
    for name, values in times.items():
        median = statistics.median(values)
        spread = f"{min(values):.3f}..{max(values):.3f}"
        print(
            f"{name:<12} {median:9.3f} {median / reference:6.2f}x {spread:>13} "
            f"{statistics.median(faults[name]):17,.0f}"
        )
