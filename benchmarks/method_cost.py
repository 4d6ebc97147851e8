"""Every registered saliency method's time and peak memory against the model's own passes of
the same batch: the plain forward (time, and the forward-only methods' memory) and one forward
+ backward to the images (the gradient methods' memory). Peak: the most bytes allocated at
once during the call beyond what was allocated before it (CUDA: the allocator's peak; CPU: the
profiler's allocation events, `live_peak.allocated_peak`). With --against REF the same table
by the vizkit of a git revision, each in a fresh process, side by side. Beside timm's models
(random weights), two built from transformers configs (random weights, no classifier: the maps
explain `vk.targets.embedding_norm()`): `hf_dinov2_base` (Dinov2Model) and `hf_clip_vit_l14`
(CLIP's ViT-L/14 image tower with its projection); give them --size 518 and 336.
Each method: one warm-up call, then the median of --repeats calls; a method that refuses the
batch (over its max_bytes, say) is a row saying so. With --budget S each vizkit's process is
stopped after S seconds and the methods it had not reached are marked (a bounded GPU step
still records what it measured).

Usage: python benchmarks/method_cost.py [--model vit_tiny_patch16_224] [--batch 8] [--size 224]
       [--methods a,b] [--repeats 3] [--threads 2] [--device cpu] [--against REF] [--record]
       [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def built(name: str, size: int):
    """The model ``name`` with random weights at ``size`` px: timm's, or one of the two
    transformers backbones the module names."""
    if name == "hf_dinov2_base":
        from transformers import Dinov2Config, Dinov2Model

        return Dinov2Model(Dinov2Config(image_size=size))
    if name == "hf_clip_vit_l14":
        from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

        config = CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                  num_attention_heads=16, patch_size=14, image_size=size,
                                  projection_dim=768)  # fmt: skip
        return CLIPVisionModelWithProjection(config)
    import timm

    return timm.create_model(name, img_size=size)


def child(args: argparse.Namespace) -> None:
    """Measure in this process with the vizkit at ``args.vizkit`` (or the working tree's);
    print one JSON line: per method, its seconds per round and its peak bytes."""
    if args.vizkit:
        sys.path.insert(0, args.vizkit)
    import torch
    from allocation_oracle import allocated_peak
    from timing import timed

    import vizkit as vk
    from vizkit.methods.registry import METHODS

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = built(args.model, args.size).eval().to(args.device)
    x = torch.randn(args.batch, 3, args.size, args.size, device=args.device)
    backbone = args.model.startswith("hf_")
    targets = vk.targets.embedding_norm() if backbone else list(range(args.batch))
    registered = dict(METHODS)
    chosen = args.methods.split(",") if args.methods else sorted(registered)

    def forward():
        with torch.inference_mode():
            model(x)

    def backward():
        images = x.clone().requires_grad_(True)
        output = vk.targets.embedding_of(model(images)) if backbone else model(images)
        torch.autograd.grad(output[:, 0].sum(), images)

    runs = {"forward": forward, "forward + backward": backward}
    runs |= {name: lambda f=registered[name]: f(model, x, targets) for name in chosen}
    for name, run in runs.items():  # one line per method, printed as it is measured
        try:
            run()  # warm-up: the method's own steady state
            calls = [timed(run, args.device) for _ in range(args.repeats)]
        except (ValueError, RuntimeError) as error:  # a refusal (over max_bytes, say) is a row
            print(json.dumps({"name": name, "refused": str(error).splitlines()[0][:160]}))
            continue
        cuda = args.device.startswith("cuda")  # the allocator's peak came with each call
        peak = max(c[2] for c in calls) if cuda else allocated_peak(run)
        print(json.dumps({"name": name, "times": [c[0] for c in calls], "peak": peak}), flush=True)


def measured(args: argparse.Namespace, package: str | None) -> dict:
    """`child` in a fresh interpreter, with the vizkit of ``package`` (None: the working tree),
    stopped after ``args.budget`` seconds: what it measured by then, per method its seconds and
    peak bytes, or why it was refused."""
    command = [sys.executable, __file__, "--child", "--model", args.model, "--batch",
               str(args.batch), "--size", str(args.size), "--repeats", str(args.repeats),
               "--threads", str(args.threads), "--device", args.device]  # fmt: skip
    if args.methods:
        command += ["--methods", args.methods]
    if package is not None:
        command += ["--vizkit", package]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent / "tests"),
                                          os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.budget)
        out, failed = done.stdout, done.returncode and done.stderr
    except subprocess.TimeoutExpired as stopped:
        out, failed = stopped.stdout or "", None
        out = out.decode() if isinstance(out, bytes) else out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith('{"name"')]
    if failed:
        sys.exit(f"{' '.join(command)} failed:\n{failed}")
    if not any(line["name"] == "forward + backward" and "times" in line for line in lines):
        sys.exit(f"{' '.join(command)} measured no baseline within {args.budget} s")
    return {line["name"]: line for line in lines}


def rows_of(results: dict[str, dict], methods: list[str]) -> list[list[str]]:
    """One row per method: for each vizkit, time / forward, peak / forward, peak / forward +
    backward (or why it has none); then the working tree's time and peak against the first
    vizkit's."""
    rows = []
    first, last = list(results)[0], list(results)[-1]
    for name in ["forward", "forward + backward", *methods]:
        row = [name]
        for result in results.values():
            row += _cells(result, name)
        both = [results[first].get(name, {}), results[last].get(name, {})]
        if len(results) > 1 and all("times" in r for r in both):
            ratio = statistics.median(both[1]["times"]) / statistics.median(both[0]["times"])
            row += [f"{ratio:.2f}x", f"{both[1]['peak'] / max(1, both[0]['peak']):.2f}x"]
        rows.append(row)
    return rows


def _cells(result: dict[str, dict], name: str) -> list[str]:
    """time / forward, peak / forward, peak / forward + backward of method ``name``."""
    line = result.get(name)
    if line is None:
        return ["not measured within the budget", "-", "-"]
    if "refused" in line:
        return [f"refused: {line['refused']}", "-", "-"]
    forward, backward = result["forward"], result["forward + backward"]
    seconds = statistics.median(line["times"]) / statistics.median(forward["times"])
    return [f"{seconds:.1f}x", f"{line['peak'] / forward['peak']:.1f}x",
            f"{line['peak'] / backward['peak']:.2f}x"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_tiny_patch16_224")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--methods", help="comma-separated (default: every registered method)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--against", help="a git revision whose vizkit runs the same methods")
    parser.add_argument(
        "--budget", type=float, help="seconds per vizkit: methods not reached are marked so"
    )
    parser.add_argument("--record", action="store_true", help="also write docs/benchmark_results/")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--vizkit", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = "float32"
    if args.child:
        return child(args)
    from report import checkout

    with tempfile.TemporaryDirectory() as tmp:
        packages = {"working tree": None}
        if args.against:
            packages = {args.against: str(checkout(args.against, Path(tmp) / "base")), **packages}
        results = {name: measured(args, package) for name, package in packages.items()}
    import torch
    from timing import device_name, print_and_record

    title = (f"{args.model} (random weights), batch {args.batch}, {args.size} px, float32, "
             f"{device_name(args.device)}, torch {torch.__version__}; "
             f"median of {args.repeats} calls after a warm-up, peak: one call")  # fmt: skip
    columns = ["method"]
    for name in results:
        columns += [f"{name}: time / forward", "peak / forward", "peak / fwd+bwd"]
    if len(results) > 1:
        columns += [f"time against {args.against}", f"peak against {args.against}"]
    from vizkit.methods.registry import METHODS

    chosen = args.methods.split(",") if args.methods else sorted(METHODS)
    print_and_record(args, title, columns, rows_of(results, chosen))


if __name__ == "__main__":
    main()
