"""CKA cost side by side: the 12 x 12 block CKA matrix of one model over a data set.

deit_tiny_patch16_224 (random weights, --model to change), 256 seeded random images, batch 32,
on --device (cpu or cuda) at --dtype (float32, or bfloat16/float16 under autocast):
  forward      the model's forward over the batches under torch.inference_mode: the baseline
  vizkit       vk.cka_matrix(model, loader): minibatch unbiased linear CKA of the block outputs
  torch-cka    torch_cka.CKA(model, model, ...).compare(loader) (PyPI torch-cka, AntixK)
  pytorch-cka  cka.compute_cka(model, model, loader, layers=...) (PyPI pytorch-cka)

Time: every method side by side in one process (`timing.rotated_rounds`: one warm-up call
each, then rounds that call every method once in turn, the order rotated), in --processes fresh
processes. On the CPU, glibc's heap trimming makes each process fault its memory in anew at its
own rate (0 to 0.9 million page faults per run, set by the process's address-space layout), and
a side-by-side ratio varies with it by up to 15 % from process to process, more than the methods
differ; the ratio reported is the median of the processes' ratios, with their range.
Peak memory and the matrices: one fresh process per method (a warm-up run, then a run whose
``ru_maxrss`` is its peak; on CUDA the peak allocated GPU memory); every process imports the
installed peers, so that each peak holds the same imports.
Reported: median wall time per run, the ratio to the forward's, page faults per run (on CUDA:
the run's peak GPU memory beyond what was allocated before it), peak memory and its ratio, and
the largest difference of each matrix from torch-cka's (or from vizkit's when torch-cka is left
out with --methods).
Usage: python benchmarks/cka.py [--images 256] [--batch 32] [--rounds 3] [--processes 3]
       [--threads 2]
       [--model deit_tiny_patch16_224] [--device cuda] [--dtype bfloat16]
       [--methods forward,vizkit]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from timing import add_device_options, device_name, precision, record, rotated_rounds

METHODS = ("forward", "vizkit", "torch-cka", "pytorch-cka")
MODEL = "deit_tiny_patch16_224"


def method_runs(methods: list[str], args: argparse.Namespace) -> dict[str, Callable[[], object]]:
    """One call per method over the same model and loader, each returning its matrix (the
    forward: None)."""
    here = Path(__file__).parent.resolve()
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]  # this file is cka.py
    import timm
    import torch

    import vizkit as vk

    peers = _import_peers(methods)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = args.device
    model = timm.create_model(args.model).eval().to(device)
    x = torch.randn(args.images, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=args.batch)
    blocks = [f"blocks.{i}" for i in range(len(model.blocks))]

    def forward() -> None:
        with torch.inference_mode():
            for (images_,) in loader:
                model(images_.to(device))

    def vizkit() -> object:
        return vk.cka_matrix(model, loader, progress=False).matrix

    def torch_cka_run() -> object:
        with warnings.catch_warnings(), _new_hooks_removed(model):
            warnings.simplefilter("ignore")  # "identical names", "no second loader"
            comparison = peers["torch-cka"].CKA(
                model, model, "a", "b", blocks, blocks, device=device
            )
            comparison.compare(loader)
        return comparison.export()["CKA"]

    def pytorch_cka_run() -> object:
        return peers["pytorch-cka"].compute_cka(
            model, model, loader, layers=blocks, device=device, progress=False
        )[0]

    runs = {"forward": forward, "vizkit": vizkit, "torch-cka": torch_cka_run,
            "pytorch-cka": pytorch_cka_run}  # fmt: skip
    return {method: runs[method] for method in methods}


@contextlib.contextmanager
def _new_hooks_removed(model: object) -> Iterator[None]:
    """torch-cka registers forward hooks (holding its features) and never removes them: remove
    those a call added, so later calls and the other methods run the model as before."""
    before = {module: set(module._forward_hooks) for module in model.modules()}
    try:
        yield
    finally:
        for module, keys in before.items():
            for key in set(module._forward_hooks) - keys:
                del module._forward_hooks[key]


def peak(method: str, args: argparse.Namespace) -> None:
    """In a fresh process: the method's peak memory (MB) and matrix, written to ``args.out``."""
    import torch

    run = method_runs([method], args)[method]
    cuda = args.device.startswith("cuda")
    with precision(args):
        run()  # warm-up: the method's own steady state (allocator, caches)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        matrix = run()
    if cuda:
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"peak_mb": peak_mb}
    if matrix is not None:
        result["matrix"] = torch.as_tensor(matrix).double().tolist()
    args.out.write_text(json.dumps(result))


def side_by_side(methods: list[str], args: argparse.Namespace) -> None:
    """In a fresh process: every method's seconds and page faults (on CUDA: peak extra GPU
    bytes) per timed run, side by side (`rotated_rounds`), written to ``args.out``."""
    runs = method_runs(methods, args)
    with precision(args):
        times, faults = rotated_rounds(runs, args.rounds, args.device, untimed=0)
    args.out.write_text(json.dumps({"times": times, "faults": faults}))


def _import_peers(methods: list[str]) -> dict:
    """The peer libraries, each imported when installed (so that every process's peak memory
    holds the same imports); one that is not installed is needed only when it is measured."""
    peers = {}
    for name, module in (("torch-cka", "torch_cka"), ("pytorch-cka", "cka")):
        if name in methods or importlib.util.find_spec(module) is not None:
            peers[name] = importlib.import_module(module)
    return peers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    add_device_options(parser)
    parser.add_argument("--one", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    methods = args.methods.split(",")
    if "forward" not in methods or not set(methods) <= set(METHODS):
        parser.error(f"--methods: a comma-separated subset of {','.join(METHODS)} with forward")
    if args.one:
        peak(args.one, args)
        return
    if args.side:
        side_by_side(methods, args)
        return

    import numpy as np
    import torch

    out = Path("/tmp") / "vizkit_cka_bench.json"

    def in_fresh_process(*flags: str) -> dict:
        command = [sys.executable, __file__, *flags, "--out", str(out)]
        for option in ("images", "batch", "rounds", "threads", "model", "methods", "device",
                       "dtype"):  # fmt: skip
            command += [f"--{option}", str(getattr(args, option))]
        quiet = {**os.environ, "TQDM_DISABLE": "1"}  # torch-cka's bars have no switch
        subprocess.run(command, check=True, env=quiet)
        return json.loads(out.read_text())

    fresh = {method: in_fresh_process("--one", method) for method in methods}
    processes = [in_fresh_process("--side") for _ in range(args.processes)]
    times = {m: [t for p in processes for t in p["times"][m]] for m in methods}
    faults = {m: [f for p in processes for f in p["faults"][m]] for m in methods}
    ratios = {  # each process's median against its own forward's
        m: [statistics.median(p["times"][m]) / statistics.median(p["times"]["forward"])
            for p in processes]
        for m in methods
    }  # fmt: skip

    base = "torch-cka" if "torch-cka" in fresh else "vizkit"
    reference = np.array(fresh[base]["matrix"])
    title = (
        f"{args.model}, {args.images} images, batch {args.batch}, {args.dtype}, "
        f"{device_name(args.device)}, torch {torch.__version__}; {args.rounds} rounds side by "
        f"side in each of {args.processes} processes (ratio: median of the processes'), peak "
        "memory of a fresh process per method"
    )
    print(title)
    cuda = args.device.startswith("cuda")
    memory = "GPU MB" if cuda else "peak MB"
    columns = ("wall s", "ratio", "range", "GPU MB/run" if cuda else "faults/run", memory,
               "ratio", f"vs {base}")  # fmt: skip
    widths = (7, 6, 11, 10, 8, 6, 12)
    print(f"{'method':<12}" + "".join(f" {c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    table = []
    for method in methods:
        seconds, measured = statistics.median(times[method]), fresh[method]
        per_run = round(statistics.median(faults[method]))
        diff = (
            f"{np.abs(np.array(measured['matrix']) - reference).max():12.1e}"
            if "matrix" in measured
            else ""
        )
        row = [
            f"{seconds:7.2f}",
            f"{statistics.median(ratios[method]):5.2f}x",
            f"{min(ratios[method]):.2f}-{max(ratios[method]):.2f}x",
            f"{per_run / 2**20:10.0f}" if cuda else f"{per_run:10,}",
            f"{measured['peak_mb']:8.0f}",
            f"{measured['peak_mb'] / fresh['forward']['peak_mb']:5.2f}x",
            diff,
        ]
        print(f"{method:<12} " + " ".join(row))
        table.append([method, *(cell.strip() for cell in row)])
    if args.record:
        print(f"recorded in {record(args, title, ['method', *columns], table)}")


if __name__ == "__main__":
    main()
