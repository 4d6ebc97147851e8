"""Attention capture cost, side by side in one run, as ratios to the plain fused forward.

deit_small_patch16_224 (random weights), batch 16, 224 px, under torch.inference_mode:
  plain     the model's forward, timm's default fused attention on
  vizkit    HookedModel.run_with_cache(x, names="blocks.*.attn.hook_pattern")
  timm      timm.utils.AttentionExtract(method="hook") on a copy with fused attention off

Each round runs the three methods in turn (order rotated every round, so drift hits them alike);
each method gets two untimed calls and then one timed call, so it is measured in its own steady
state. Interleaving single calls instead measures the allocator state the previous method left
behind: the retained maps (12 x 15 MB per forward here) cost page faults whose number depends on
glibc's dynamic mmap/trim thresholds, i.e. on history (seen here: the same code at 1.06x-1.39x).
Reported: the median over rounds, as a ratio to the plain forward.
Usage: python benchmarks/capture.py [--batch 16] [--repeats 5] [--device cpu]
"""

from __future__ import annotations

import copy

import torch
from timing import deit_setup, header, print_table, rotated_rounds
from timm.utils import AttentionExtract

import vizkit as vk


def main() -> None:
    args, model, x = deit_setup(__doc__.splitlines()[0])
    hm = vk.HookedModel(model)
    unfused = copy.deepcopy(model)
    for m in unfused.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    extractor = AttentionExtract(unfused, names=["blocks.*.attn.attn_drop"], method="hook")

    runs = {
        "plain": lambda: model(x),
        "vizkit": lambda: hm.run_with_cache(x, names="blocks.*.attn.hook_pattern"),
        "timm": lambda: extractor(x),
    }
    with torch.inference_mode():
        _, cache = runs["vizkit"]()
        assert len(cache) == len(model.blocks), "vizkit captured the wrong number of maps"
        assert len(runs["timm"]()) == len(model.blocks), "AttentionExtract captured nothing"
        times, faults = rotated_rounds(runs, args.repeats, args.device)

    print(header(args))
    print_table(times, faults, "plain")


if __name__ == "__main__":
    main()
