"""CKA cost side by side: the 12 x 12 block CKA matrix of one model over a data set.

deit_tiny_patch16_224 (random weights, --model to change), 256 seeded random images, batch 32,
on --device (cpu or cuda) at --dtype (float32, or bfloat16/float16 under autocast):
  forward      the model's forward over the batches under torch.inference_mode: the baseline
  vizkit       vk.cka_matrix(model, loader): minibatch unbiased linear CKA of the block outputs
  torch-cka    torch_cka.CKA(model, model, ...).compare(loader) (PyPI torch-cka, AntixK)
  pytorch-cka  cka.compute_cka(model, model, loader, layers=...) (PyPI pytorch-cka)

Every measurement is a fresh process (so peak RSS is its own) that imports all four libraries
(a peer that is not installed is needed only where it is measured), builds the model and the
loader, runs its method once untimed (warm-up) and once timed;
``ru_maxrss`` at the end is its peak (on CUDA: the peak allocated GPU memory). Rounds rotate the
order; medians are reported: wall time (and its range), process CPU time (user + system, steadier
than wall time on a shared machine), peak memory, each as a ratio to the forward baseline, and
the largest difference of each matrix from torch-cka's (or from vizkit's when torch-cka is left
out with --methods).
Usage: python benchmarks/cka.py [--images 256] [--batch 32] [--rounds 5] [--threads 2]
       [--model deit_tiny_patch16_224] [--device cuda] [--dtype bfloat16]
       [--methods forward,vizkit]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

from timing import add_device_options, device_name, precision, record

METHODS = ("forward", "vizkit", "torch-cka", "pytorch-cka")
MODEL = "deit_tiny_patch16_224"


def measure(method: str, args: argparse.Namespace) -> None:
    """One measurement in this process; writes seconds, peak memory and the matrix to
    ``args.out``."""
    here = Path(__file__).parent.resolve()
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]  # this file is cka.py
    import timm
    import torch

    import vizkit as vk

    peers = _import_peers(method)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = args.device
    model = timm.create_model(args.model).eval().to(device)
    x = torch.randn(args.images, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=args.batch)
    blocks = [f"blocks.{i}" for i in range(len(model.blocks))]

    def forward():
        with torch.inference_mode():
            for (images_,) in loader:
                model(images_.to(device))

    def vizkit():
        return vk.cka_matrix(model, loader, progress=False).matrix

    def torch_cka_run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "identical names", "no second loader"
            comparison = peers["torch-cka"].CKA(
                model, model, "a", "b", blocks, blocks, device=device
            )
            comparison.compare(loader)
        return comparison.export()["CKA"]

    def pytorch_cka_run():
        return peers["pytorch-cka"].compute_cka(
            model, model, loader, layers=blocks, device=device, progress=False
        )[0]

    run = {
        "forward": forward,
        "vizkit": vizkit,
        "torch-cka": torch_cka_run,
        "pytorch-cka": pytorch_cka_run,
    }[method]
    cuda = device.startswith("cuda")
    with precision(args):
        run()  # warm-up: the method's own steady state (allocator, caches)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        cpu_start, start = _cpu_seconds(), time.perf_counter()
        matrix = run()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    if cuda:
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"seconds": seconds, "cpu": _cpu_seconds() - cpu_start, "peak_mb": peak_mb}
    if matrix is not None:
        result["matrix"] = torch.as_tensor(matrix).double().tolist()
    args.out.write_text(json.dumps(result))


def _import_peers(method: str) -> dict:
    """The peer libraries, imported in every process so that each process's peak memory holds
    the same imports; a peer that is not installed is needed only where ``method`` is it."""
    peers = {}
    for name, module in (("torch-cka", "torch_cka"), ("pytorch-cka", "cka")):
        if name == method or importlib.util.find_spec(module) is not None:
            peers[name] = importlib.import_module(module)
    return peers


def _cpu_seconds() -> float:
    """User + system CPU time of this process (less sensitive than wall time to other load)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    add_device_options(parser)
    parser.add_argument("--one", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        measure(args.one, args)
        return

    import numpy as np
    import torch

    methods = args.methods.split(",")
    results: dict[str, list[dict]] = {m: [] for m in methods}
    out = Path("/tmp") / "vizkit_cka_bench.json"
    for round_ in range(args.rounds):
        shift = round_ % len(methods)
        for method in methods[shift:] + methods[:shift]:
            command = [sys.executable, __file__, "--one", method, "--out", str(out)]
            for option in ("images", "batch", "threads", "model", "device", "dtype"):
                command += [f"--{option}", str(getattr(args, option))]
            subprocess.run(command, check=True)
            results[method].append(json.loads(out.read_text()))

    def median(method: str, key: str) -> float:
        return statistics.median(r[key] for r in results[method])

    base = "torch-cka" if "torch-cka" in results else "vizkit"
    reference = np.array(results[base][0]["matrix"])
    title = (
        f"{args.model}, {args.images} images, batch {args.batch}, {args.dtype}, "
        f"{device_name(args.device)}, torch {torch.__version__}; median of {args.rounds} rounds, "
        "one process per run"
    )
    print(title)
    table = []
    memory = "GPU MB" if args.device.startswith("cuda") else "peak MB"
    columns = ("wall s", "range", "ratio", "CPU s", "ratio", memory, "ratio", f"vs {base}")
    widths = (7, 11, 6, 6, 6, 8, 6, 12)
    print(f"{'method':<12}" + "".join(f" {c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    for method, runs in results.items():
        walls = [r["seconds"] for r in runs]
        diff = (
            f"{np.abs(np.array(runs[0]['matrix']) - reference).max():12.1e}"
            if "matrix" in runs[0]
            else ""
        )
        row = [
            f"{median(method, 'seconds'):7.2f}",
            f"{min(walls):5.2f}-{max(walls):<5.2f}",
            f"{median(method, 'seconds') / median('forward', 'seconds'):5.2f}x",
            f"{median(method, 'cpu'):6.2f}",
            f"{median(method, 'cpu') / median('forward', 'cpu'):5.2f}x",
            f"{median(method, 'peak_mb'):8.0f}",
            f"{median(method, 'peak_mb') / median('forward', 'peak_mb'):5.2f}x",
            diff,
        ]
        print(f"{method:<12} " + " ".join(row))
        table.append([method, *(cell.strip() for cell in row)])
    if args.record:
        print(f"recorded in {record(args, title, ['method', *columns], table)}")


if __name__ == "__main__":
    main()
