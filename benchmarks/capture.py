"""Attention capture cost, side by side in one run, as ratios to the plain fused forward.

Per model (default: deit_small_patch16_224, eva02_small_patch14_224 (RoPE) and
swin_tiny_patch4_window7_224 (window maps); random weights), batch 16, 224 px, under
torch.inference_mode:
  plain     the model's forward, timm's default attention (fused where timm fuses it)
  vizkit    HookedModel.run_with_cache(x, names="*.attn.hook_pattern"), every block's map, on
            the path it chooses (pattern_path="auto")
  unfused   the same with pattern_path="unfused": the attention runs its explicit path
  beside    the same with pattern_path="beside": the fused kernel computes the output and the
            map is computed beside it (timm's Attention; other modules run unfused)
  timm      timm.utils.AttentionExtract(method="hook") on a copy with fused attention off

A Hugging Face transformers ViT (``transformers:vit_small``: ViT-S/16's shape, 224 px, random
weights, attn_implementation="sdpa") is measured beside them:
  plain     the model's forward (sdpa)
  vizkit    run_with_cache(x, names=every layer's map): eager attention for the call
  eager     a copy built with attn_implementation="eager", its plain forward
  library   that copy with output_attentions=True (transformers' own way to get the maps)

Each round runs the three methods in turn (order rotated every round, so drift hits them alike);
each method gets two untimed calls and then one timed call, so it is measured in its own steady
state. Interleaving single calls instead measures the allocator state the previous method left
behind: the retained maps (12 x 15 MB per forward here) cost page faults whose number depends on
glibc's dynamic mmap/trim thresholds, i.e. on history (seen here: the same code at 1.06x-1.39x).
Reported: the median over rounds, as a ratio to the plain forward.
Usage: python benchmarks/capture.py [--models a,b] [--batch 16] [--repeats 5] [--device cpu]
       [--dtype float32|bfloat16|float16]
"""

from __future__ import annotations

import copy

import torch
from timing import build, header, parse_args, precision, print_table, rotated_rounds
from timm.utils import AttentionExtract

import vizkit as vk

MODELS = (
    "deit_small_patch16_224,eva02_small_patch14_224,swin_tiny_patch4_window7_224,"
    "transformers:vit_small"
)
TRANSFORMERS = {  # ViT-S/16's shape
    "vit_small": {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6,
                  "intermediate_size": 1536, "image_size": 224, "patch_size": 16},
}  # fmt: skip


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], models=MODELS)
    for name in args.models.split(","):
        if name.startswith("transformers:"):
            measure_transformers(args, name)
            continue
        model, x = build(name, args)
        measure(args, name, model, x)


def measure_transformers(args, name: str) -> None:
    """The transformers rows: plain sdpa, vizkit's capture, eager, output_attentions."""
    import transformers

    config = TRANSFORMERS[name.split(":", 1)[1]]
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(
        transformers.ViTConfig(attn_implementation="sdpa", **config)
    )
    model = model.eval().to(args.device)
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    x = torch.randn(args.batch, 3, 224, 224, device=args.device)
    hm = vk.HookedModel(model)
    names = [n for n in hm.hook_names() if n.endswith(".hook_pattern")]
    runs = {
        "plain": lambda: model(x),
        "vizkit": lambda: hm.run_with_cache(x, names=names),
        "eager": lambda: eager(x),
        "library": lambda: eager(x, output_attentions=True),
    }
    with torch.inference_mode(), precision(args):
        _, cache = runs["vizkit"]()
        assert len(cache) == len(names) == config["num_hidden_layers"]
        assert len(runs["library"]().attentions) == len(names)
        times, faults = rotated_rounds(runs, args.repeats, args.device)
    print_table(times, faults, "plain", args, header(args, model=f"{name} (sdpa)"))
    print()


def measure(args, name: str, model, x) -> None:
    hm = vk.HookedModel(model)
    names = [n for n in hm.hook_names() if n.endswith(".attn.hook_pattern")]
    unfused = copy.deepcopy(model)
    for m in unfused.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    extractor = AttentionExtract(unfused, names=["*attn.attn_drop"], method="hook")

    runs = {
        "plain": lambda: model(x),
        "vizkit": lambda: hm.run_with_cache(x, names=names),
        "unfused": lambda: hm.run_with_cache(x, names=names, pattern_path="unfused"),
        "beside": lambda: hm.run_with_cache(x, names=names, pattern_path="beside"),
        "timm": lambda: extractor(x),
    }
    with torch.inference_mode(), precision(args):
        _, cache = runs["vizkit"]()
        assert len(cache) == len(names), "vizkit captured the wrong number of maps"
        assert len(runs["timm"]()) == len(names), "AttentionExtract read other modules"
        times, faults = rotated_rounds(runs, args.repeats, args.device)

    print_table(times, faults, "plain", args, header(args, model=name))
    print()


if __name__ == "__main__":
    main()
