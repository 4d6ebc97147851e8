"""Where the host time of capture and CKA goes beyond the forward: a trace, not a guess.

Two workloads on --device (random-init --model, --dtype under autocast):
  capture  HookedModel.run_with_cache(x, names=every block's attention map) on one batch
  cka      vk.cka_matrix(model, loader) over --images seeded images in batches of --batch
each beside its plain forward (the same batches under torch.inference_mode). For each, after a
warm-up: wall time against the forward (CUDA synchronized), then one profiled run:
torch.profiler's operators by self CPU time and the count of host-device synchronizations
(cudaStreamSynchronize, cudaDeviceSynchronize, device-to-host copies), and cProfile's Python
functions by their own time; then the operators again, grouped by the Python lines that called
them. With --out DIR the tables and a gzipped Chrome trace of each workload are written there.
Usage: python benchmarks/host_profile.py [--device cuda] [--dtype bfloat16] [--batch 64]
       [--images 512] [--model vit_base_patch16_224] [--what capture,cka] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import io
import pstats
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from timing import add_device_options, device_name, precision

import vizkit as vk

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def seconds(run: Callable[[], object], device: str, repeats: int = 3) -> float:
    """The median wall time of ``repeats`` calls after one untimed call."""
    run()
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def profile(name: str, run: Callable[[], object], args: argparse.Namespace) -> str:
    """One profiled call of ``run``: operator and Python tables, synchronization counts."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    verbose = torch._C._profiler._ExperimentalConfig(verbose=True)  # Python stacks in tables
    with torch.profiler.profile(
        activities=activities, with_stack=True, experimental_config=verbose
    ) as prof:
        run()
    events = prof.key_averages()
    syncs = {e.key: e.count for e in events if e.key in SYNCS}
    copies = {e.key: e.count for e in events if "Memcpy" in e.key and "DtoH" in e.key}
    lines = [f"## {name}: synchronizations {syncs or 'none'}, device-to-host copies {copies}"]
    lines.append(events.table(sort_by="self_cpu_time_total", row_limit=25))
    by_caller = prof.key_averages(group_by_stack_n=4)
    lines.append(by_caller.table(sort_by="self_cpu_time_total", row_limit=20))
    python = cProfile.Profile()
    python.enable()
    run()
    python.disable()
    buffer = io.StringIO()
    pstats.Stats(python, stream=buffer).sort_stats("tottime").print_stats(30)
    lines.append(buffer.getvalue())
    if args.out is not None:
        trace = args.out / f"{name}.trace.json"
        prof.export_chrome_trace(str(trace))
        with trace.open("rb") as source, gzip.open(f"{trace}.gz", "wb") as target:
            shutil.copyfileobj(source, target)
        trace.unlink()
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--what", default="capture,cka")
    parser.add_argument("--out", type=Path)
    args = add_device_options(parser).parse_args()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = vk.create_model(args.model).eval().to(args.device)
    hm = vk.HookedModel(model)
    x = torch.randn(args.batch, 3, 224, 224, device=args.device)
    images = torch.randn(args.images, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images), batch_size=args.batch
    )
    maps = [n for n in hm.hook_names() if n.endswith(".attn.hook_pattern")]

    def forward_loader():
        with torch.inference_mode():
            for (batch,) in loader:
                model(batch.to(args.device))

    workloads = {
        "capture": (
            lambda: model(x),
            lambda: hm.run_with_cache(x, names=maps),
        ),
        "cka": (forward_loader, lambda: vk.cka_matrix(hm, loader, progress=False)),
    }
    report = [f"{args.model}, batch {args.batch}, {args.dtype}, {device_name(args.device)}"]
    with torch.inference_mode(), precision(args):
        for name in args.what.split(","):
            forward, method = workloads[name]
            base, cost = seconds(forward, args.device), seconds(method, args.device)
            report.append(
                f"# {name}: {cost * 1e3:.1f} ms against the forward's {base * 1e3:.1f} ms "
                f"({cost / base:.2f}x)"
            )
            report.append(profile(f"{name}_forward", forward, args))
            report.append(profile(name, method, args))
    text = "\n".join(report)
    print(text)
    if args.out is not None:
        (args.out / "host_profile.txt").write_text(text)


if __name__ == "__main__":
    main()
