"""What `vizkit report` costs: wall seconds and peak resident memory of a whole report, and each
section's seconds and the peak after it, each run in a fresh process (peak memory is per
process); with --against REF, the same report by the vizkit of a git revision, side by side.
Issue 32's setting: a random-init ViT-S (deit_small_patch16_224) on 8 photos (crops and flips of
scikit-learn's two sample photos, 427 x 640) with 2 CPU threads.

Usage: python benchmarks/report.py [--model deit_small_patch16_224] [--n 8] [--data FOLDER]
       [--against REF] [--threads 2] [--repeats 1] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sample_photos(folder: Path, n: int) -> Path:
    """``n`` photos in ``folder``: scikit-learn's two sample photos, whole, mirrored and cropped
    (a different image each, all real photographs of 427 x 640 or less)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    views = [
        lambda a: a,
        lambda a: a[:, ::-1],
        lambda a: a[40:380, 100:540],
        lambda a: a[::-1, ::-1][60:420, 60:600],
    ]
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        view = views[(i // len(photos)) % len(views)](photos[i % len(photos)])
        Image.fromarray(np.ascontiguousarray(view)).save(folder / f"photo_{i}.png")
    return folder


def peak_gb() -> float:
    """This process's peak resident memory so far (GB): Linux's VmHWM. Not getrusage's
    ru_maxrss (the fallback elsewhere): Linux carries it across exec, so a child holds its
    parent's peak when it was started (1.14 GB: this script's, after torch and the photos)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1e6  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def child(args: argparse.Namespace) -> None:
    """Build one report in this process and print its costs as JSON: each step's seconds and
    the process's peak memory after it (the steps are `load_inputs` and the sections)."""
    if args.vizkit:
        sys.path.insert(0, args.vizkit)
    import torch

    torch.set_num_threads(args.threads)
    import vizkit.report as report

    steps: list[list] = [["import", 0.0, peak_gb()]]

    def measured(name, build):
        def run(*a, **k):
            start = time.perf_counter()
            try:
                return build(*a, **k)
            finally:
                steps.append([name, time.perf_counter() - start, peak_gb()])

        return run

    report.load_inputs = measured("inputs", report.load_inputs)
    for name, build in list(report.SECTIONS.items()):
        report.SECTIONS[name] = measured(name, build)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        report.build_report(args.model, args.data, args.n, out, progress=False)
    costs = {"seconds": time.perf_counter() - start, "peak GB": peak_gb(), "steps": steps}
    print(json.dumps({"vizkit": report.__file__, **costs}))


def checkout(ref: str, into: Path) -> Path:
    """The ``vizkit`` package of git revision ``ref``, unpacked under ``into``."""
    archive = subprocess.run(
        ["git", "archive", ref, "vizkit"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_once(args: argparse.Namespace, package: Path | None) -> dict:
    """One report in a fresh interpreter: its costs (`child`)."""
    command = [sys.executable, __file__, "--child", "--model", args.model, "--n", str(args.n),
               "--data", args.data, "--threads", str(args.threads)]  # fmt: skip
    if package is not None:
        command += ["--vizkit", str(package)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--data", help="an image folder (default: 8 sample photos)")
    parser.add_argument("--against", help="a git revision whose vizkit runs the same report")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--vizkit", help=argparse.SUPPRESS)
    parser.add_argument("--record", action="store_true", help="also write docs/benchmark_results/")
    args = parser.parse_args()
    args.device, args.dtype = "cpu", "float32"
    if args.child:
        return child(args)
    import torch
    from timing import record

    torch.set_num_threads(args.threads)  # the stamp names the children's thread count
    with tempfile.TemporaryDirectory() as tmp:
        if args.data is None:
            args.data = str(sample_photos(Path(tmp) / "photos", args.n))
        packages = {"working tree": None}
        if args.against:
            packages = {args.against: checkout(args.against, Path(tmp) / "base"), **packages}
        runs = {name: [] for name in packages}
        for _ in range(args.repeats):  # alternated, so drift hits both alike
            for name, package in packages.items():
                runs[name].append(run_once(args, package))
    data = f"{args.n} sample photos" if args.data.startswith(tempfile.gettempdir()) else args.data
    title = (f"vizkit report --model {args.model} --n {args.n}, {data}, {args.threads} threads, "
             f"torch {torch.__version__}; median of {args.repeats} fresh processes")  # fmt: skip
    print(title)
    base = next(iter(runs))
    medians = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "peak GB")}
        for name, rs in runs.items()
    }
    rows = []
    for name, cost in medians.items():
        ratios = [cost[k] / medians[base][k] for k in cost]
        spread = [f"{min(r[k] for r in runs[name]):.2f}..{max(r[k] for r in runs[name]):.2f}"
                  for k in ("seconds", "peak GB")]  # fmt: skip
        imported = statistics.median(r["steps"][0][2] for r in runs[name])
        rows.append([name, f"{cost['seconds']:.1f}", f"{ratios[0]:.2f}x", spread[0],
                     f"{cost['peak GB']:.2f}", f"{ratios[1]:.2f}x", spread[1],
                     f"{imported:.2f}"])  # fmt: skip
        print("  ".join(rows[-1]))
        steps = runs[name][-1]["steps"]
        print("   " + ", ".join(f"{s} {t:.1f} s -> {gb:.2f} GB" for s, t, gb in steps))
    if args.record:
        columns = ["vizkit", "wall s", f"ratio to {base}", "range s", "peak GB",
                   f"ratio to {base}", "range GB", "GB after imports"]  # fmt: skip
        print(f"recorded in {record(args, title, columns, rows)}")


if __name__ == "__main__":
    main()
