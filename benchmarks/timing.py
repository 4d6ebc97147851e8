"""Shared timing for the benchmarks: rotated rounds, median per method, page faults; with
``--record``, each table is also written to docs/benchmark_results/ stamped with the device,
threads and versions, from where the manual's benchmarks page is generated."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import timm
import torch
from torch import nn

import vizkit as vk


def add_device_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--device (cpu, cuda, ...) and --dtype (float32, or bfloat16/float16 under autocast)."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument(
        "--record", action="store_true", help="also write the table to docs/benchmark_results/"
    )
    return parser


def parse_args(description: str, **defaults: str) -> argparse.Namespace:
    """The benchmarks' common command line: --model (or --models), --batch, --size, --repeats,
    --device, --dtype (float32, or bfloat16/float16 under autocast); --images where a default
    is given."""
    parser = argparse.ArgumentParser(description=description)
    if "models" in defaults:
        parser.add_argument("--models", default=defaults["models"], help="comma-separated")
    else:
        parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=224, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=5)
    if "images" in defaults:
        parser.add_argument("--images", type=int, default=defaults["images"])
    return add_device_options(parser).parse_args()


DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


@contextlib.contextmanager
def precision(args: argparse.Namespace) -> Iterator[None]:
    """Autocast to ``--dtype`` on ``--device`` (nothing for float32)."""
    dtype = DTYPES[args.dtype]
    if dtype is None:
        yield
        return
    with torch.autocast(torch.device(args.device).type, dtype=dtype):
        yield


def device_name(device: str) -> str:
    """The accelerator's name, or the processor's architecture and thread count."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads"


def build(name: str, args: argparse.Namespace) -> tuple[nn.Module, torch.Tensor]:
    """The model (random weights, eval, on the device) and a seeded batch of ``--size`` images."""
    torch.manual_seed(0)
    sized = {} if args.size == 224 else {"img_size": args.size}
    model = vk.create_model(name, **sized).eval().to(args.device)
    x = torch.randn(args.batch, 3, args.size, args.size, device=args.device)
    return model, x


def deit_setup(description: str) -> tuple[argparse.Namespace, nn.Module, torch.Tensor]:
    """`parse_args` and `build` for the one-model benchmarks."""
    args = parse_args(description)
    return (args, *build(args.model, args))


def header(args: argparse.Namespace, extra: str = "", model: str | None = None) -> str:
    """One line naming the model, batch, device, threads and torch version of a run."""
    return (
        f"{model or args.model}, batch {args.batch}, {args.size} px, {args.dtype}, "
        f"{device_name(args.device)}, torch {torch.__version__}; median of "
        f"{args.repeats} rounds{extra}"
    )


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One forward + backward of ``model`` on (x, y) with cross-entropy (gradients reset)."""

    def run() -> None:
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    return run


def timed(fn: Callable[[], object], device: str) -> tuple[float, int, int | None]:
    """Wall seconds, minor page faults and (on CUDA) the GPU bytes the call allocated at its
    peak beyond what was allocated when it began (the model, the batch, other methods' leftovers
    are not counted)."""
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - before if cuda else None
    return elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults, peak


def rotated_rounds(
    runs: dict[str, Callable[[], object]], repeats: int, device: str, untimed: int = 2
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Each round runs every method in turn, order rotated each round so drift hits them alike;
    each method gets ``untimed`` calls and then one timed call (its own steady state).

    Returns:
        seconds and page faults per method, one value per round; on CUDA the faults are the
        call's peak GPU bytes instead (`timed`; page faults of the host say little there).
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
            seconds, page_faults, peak = timed(runs[name], device)
            times[name].append(seconds)
            faults[name].append(page_faults if peak is None else peak)
    return times, faults


def print_table(
    times: dict[str, list[float]],
    faults: dict[str, list[int]],
    base: str,
    args: argparse.Namespace,
    title: str,
) -> None:
    """Print ``title`` and the median milliseconds per method with its ratio to ``base``; the
    last column is page faults per call (CPU) or peak allocated GPU memory (CUDA), with its ratio
    to ``base``'s. With ``args.record``, also write them (`record`)."""
    print(title)
    reference = statistics.median(times[base])
    cuda = args.device.startswith("cuda")
    last = "peak extra GPU MB" if cuda else "page faults/call"
    print(f"{'method':<12} {'median ms':>10} {'ratio':>7} {'range ms':>15} {last:>20}")
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        spread = f"{min(values) * 1e3:.1f}..{max(values) * 1e3:.1f}"
        other = statistics.median(faults[name])
        if cuda:
            ratio = other / statistics.median(faults[base])
            column = f"{other / 1e6:,.0f} ({ratio:.2f}x)"
        else:
            column = f"{other:,.0f}"
        print(
            f"{name:<12} {median * 1e3:10.1f} {median / reference:6.2f}x {spread:>15} {column:>20}"
        )
        rows.append([name, f"{median * 1e3:.1f}", f"{median / reference:.2f}x", spread, column])
    if args.record:
        columns = ["method", "median ms", f"ratio to {base}", "range ms", last]
        print(f"recorded in {record(args, title, columns, rows)}")


ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "benchmark_results"


def stamp(args: argparse.Namespace) -> dict:
    """Where and with what a run was measured."""
    return {
        "date": datetime.date.today().isoformat(),
        "device": device_name(args.device),
        "threads": torch.get_num_threads(),
        "dtype": args.dtype,
        "repeats": getattr(args, "repeats", getattr(args, "rounds", None)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "vizkit": vk.__version__,
        "command": "python " + " ".join(_from_root(a) for a in sys.argv),
    }


def _from_root(argument: str) -> str:
    """A script path as run from the repository's root (``benchmarks/capture.py``)."""
    path = Path(argument).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) and path.is_file() else argument


def record(args: argparse.Namespace, title: str, columns: list[str], rows: list[list]) -> Path:
    """Write one table (its column names and rows of cells as printed) as JSON to
    docs/benchmark_results/: one file per script, device, dtype and configuration (the title
    before its ";"), replaced by the next run of the same."""
    script = Path(sys.argv[0]).stem
    key = "_".join((script, args.device.split(":")[0], args.dtype))
    configuration = hashlib.sha1(title.split(";")[0].encode()).hexdigest()[:8]
    file = RESULTS / f"{key}_{configuration}.json"
    RESULTS.mkdir(exist_ok=True)
    body = {"benchmark": script, "title": title, "stamp": stamp(args), "columns": columns,
            "rows": [[str(cell) for cell in row] for row in rows]}  # fmt: skip
    file.write_text(json.dumps(body, indent=1) + "\n")
    return file


def print_and_record(
    args: argparse.Namespace, title: str, columns: list[str], rows: list[list]
) -> None:
    """Print ``title`` and the table as " | "-separated lines; with ``args.record`` also write
    it (`record`)."""
    print(title)
    for line in [columns, *rows]:
        print(" | ".join(str(cell) for cell in line))
    if args.record:
        print(f"recorded in {record(args, title, columns, rows)}")
