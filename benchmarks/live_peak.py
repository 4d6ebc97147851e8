"""Peak live tensor storage of an analysis on the CPU, counted at the dispatcher: every tensor an
operator returns is counted until its last Python reference dies (a kernel's internal scratch is
not seen). The CPU's stand-in for `torch.cuda.max_memory_allocated`, at a GPU row's shape.

    python benchmarks/live_peak.py              # rollout, DINOv2-S reg4, 518 px, batch 1
    python benchmarks/live_peak.py --analysis grad_rollout --size 224
"""

from __future__ import annotations

import argparse
import collections
import weakref

import timm
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vizkit as vk

ANALYSES = {
    "rollout": lambda model, x: vk.rollout(model, x),
    "grad_rollout": lambda model, x: vk.grad_rollout(model, x, target=3, max_bytes=2**40),
}


class LiveStorage(TorchDispatchMode):
    """``peak``: the most bytes of CPU tensor storage alive at once while the mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.size: dict[int, int] = {}
        self.refs: collections.Counter = collections.Counter()

    def _release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.live -= self.size.pop(key)
            del self.refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                key = t.untyped_storage().data_ptr()
                if key not in self.size:
                    self.size[key] = t.untyped_storage().nbytes()
                    self.live += self.size[key]
                    self.peak = max(self.peak, self.live)
                self.refs[key] += 1
                weakref.finalize(t, self._release, key)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--analysis", choices=sorted(ANALYSES), default="rollout")
    parser.add_argument("--model", default="vit_small_patch14_reg4_dinov2")
    parser.add_argument("--size", type=int, default=518)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = timm.create_model(args.model, img_size=args.size).eval()
    x = torch.randn(args.batch, 3, args.size, args.size)
    ANALYSES[args.analysis](model, x)  # once before counting: lazily built buffers
    with LiveStorage() as counted:
        ANALYSES[args.analysis](model, x)
    print(f"{args.analysis} {args.model} {args.size} px batch {args.batch}: peak live tensor "
          f"storage {counted.peak / 2**20:.2f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
