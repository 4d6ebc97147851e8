"""Ways to compute the attention map beside a fused kernel (`vizkit.hooks.beside`), timed.

On ViT-B's shapes (--batch images, 12 heads, 197 tokens, head size 64), from queries and keys laid
out as timm's Attention makes them (views of one qkv projection), under bfloat16 autocast:
  today         softmax((q · scale) kᵀ), as `vizkit.families.timm.vit.attach_beside` computes it
  fp32 softmax  the same logits, softmax(dtype=float32) outside autocast (one kernel, no cast)
  contiguous k  k made contiguous before the product
  padded keys   keys padded to a multiple of 8 (an aligned GEMM output), the map sliced back
  scale after   (q kᵀ) · scale in place
  float32       the product and softmax in float32
Per variant: CUDA-event time per layer (mean of 20 calls after 3), the map's dtype, its largest
difference from today's, and the GPU kernels one call launches. The capture goal (issue 52:
capture at most 1.25x the fused forward) needs the map's extra cost under about a sixth of a
layer's forward.
Usage: python benchmarks/beside_map.py [--batch 64] (CUDA only)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

HEADS, TOKENS, HEAD_SIZE = 12, 197, 64


def variants(q: Tensor, k: Tensor) -> dict[str, Callable[[], Tensor]]:
    scale = HEAD_SIZE**-0.5
    pad = (-TOKENS) % 8

    def fp32_softmax() -> Tensor:
        logits = (q * scale) @ k.transpose(-2, -1)
        with torch.autocast("cuda", enabled=False):
            return logits.softmax(-1, dtype=torch.float32)

    def padded() -> Tensor:
        logits = (q * scale) @ F.pad(k, (0, 0, 0, pad)).transpose(-2, -1)
        return logits[..., :TOKENS].softmax(-1)

    def float32() -> Tensor:
        with torch.autocast("cuda", enabled=False):
            return ((q.float() * scale) @ k.float().transpose(-2, -1)).softmax(-1)

    return {
        "today": lambda: ((q * scale) @ k.transpose(-2, -1)).softmax(-1),
        "fp32 softmax": fp32_softmax,
        "contiguous k": lambda: ((q * scale) @ k.contiguous().transpose(-2, -1)).softmax(-1),
        "padded keys": padded,
        "scale after": lambda: (q @ k.transpose(-2, -1)).mul_(scale).softmax(-1),
        "float32": float32,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    qkv = torch.randn(args.batch, TOKENS, 3, HEADS, HEAD_SIZE, device="cuda")
    q, k, _ = qkv.to(torch.bfloat16).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, d) views
    print(f"batch {args.batch}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    reference = None
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        for name, run in variants(q, k).items():
            out = run()
            reference = out.float() if reference is None else reference
            for _ in range(3):
                run()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                run()
            end.record()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
                run()
                torch.cuda.synchronize()
            kernels = [
                f"{e.key[:48]} {e.device_time_total:.0f} us"
                for e in p.key_averages()
                if e.device_time_total > 0
            ]
            difference = (out.float() - reference).abs().max().item()
            print(f"{name:<13} {start.elapsed_time(end) / 20 * 1e3:8.1f} us per layer, "
                  f"{out.dtype}, max diff {difference:.1e}: {'; '.join(kernels)}")  # fmt: skip


if __name__ == "__main__":
    main()
