"""Attribution patching's cost against the forward and backward it needs (issue 72's goal: node
and edge scores at most 3x one forward and backward of the clean and corrupted batches; EAP-IG
steps times that), and exact patching's runs counted.

Model: ViT-S/16 (vit_small_patch16_224, random weights) at --size px, --batch clean and as many
corrupted images (seeded noise). Baseline ("fwd+bwd x2"): a forward and a backward of the
clean batch and of the corrupted one (the target logit's gradient to the input). Entries:
`vk.attribution_patching` with heads (EAP), with each head's query, key and value edges
(qkv=True), without heads (EAP by blocks), and EAP-IG with --steps.
Each round runs every entry once, order rotated; the median over rounds is reported.
Exact patching's cost is a count (one run of the batch per node and edge), printed below.
Memory: what autograd saves for backward (`vizkit.hooks.saved_bytes`) in one forward and
backward of the clean batch against one attribution patching call (EAP-IG's steps run one
after another, each saving what EAP saves); on CUDA the table's last column is each entry's
peak GPU memory beyond what was allocated before it.
Usage: python benchmarks/circuits.py [--batch 8] [--size 224] [--steps 5] [--repeats 3]
       [--device cpu] [--record]
"""

from __future__ import annotations

import argparse

import torch
from timing import add_device_options, device_name, print_table, rotated_rounds

import vizkit as vk
from vizkit.circuits import ComponentGraph
from vizkit.hooks import saved_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = add_device_options(parser).parse_args()
    args.dtype = "float32"
    torch.manual_seed(0)
    sized = {} if args.size == 224 else {"img_size": args.size}
    model = vk.create_model(args.model, **sized).eval().to(args.device)
    clean, corrupted = torch.randn(2, args.batch, 3, args.size, args.size, device=args.device)
    with torch.no_grad():
        classes = model(clean).argmax(1)

    def forward_backward(batches=(clean, corrupted)):
        for x in batches:
            x = x.clone().requires_grad_(True)
            torch.autograd.grad(model(x).gather(1, classes[:, None]).sum(), x)

    def attribution(**options):
        return lambda: vk.attribution_patching(model, clean, corrupted, target=classes,
                                               progress=False, **options)  # fmt: skip

    runs = {
        "fwd+bwd x2": forward_backward,
        "eap heads": attribution(),
        "eap heads qkv": attribution(qkv=True),
        "eap blocks": attribution(heads=False),
        f"eap-ig {args.steps} steps": attribution(method="eap-ig", steps=args.steps),
    }
    times, faults = rotated_rounds(runs, args.repeats, args.device, untimed=0)
    title = (
        f"{args.model} (random weights), batch {args.batch}, {args.size} px, float32, "
        f"{device_name(args.device)}, torch {torch.__version__}; attribution patching against "
        f"a forward and backward of the clean and corrupted batches; median of {args.repeats} "
        "rounds"
    )
    print_table(times, faults, "fwd+bwd x2", args, title)
    heads = model.blocks[0].attn.num_heads
    graph = ComponentGraph(tuple(f"blocks.{i}" for i in range(len(model.blocks))),
                           (heads,) * len(model.blocks))  # fmt: skip
    nodes, edges = len(graph.upstream), int(graph.edges().sum())
    print(f"exact patching of this graph: {nodes} nodes + {edges} edges = {nodes + edges} runs "
          f"of the batch (attribution: 1 backward; EAP-IG: {args.steps})")  # fmt: skip
    once = saved_bytes(lambda: forward_backward((clean,)))
    saved = {name: saved_bytes(runs[name]) for name in ("eap heads", "eap blocks")}
    print(
        f"saved for backward: fwd+bwd of the clean batch {once / 1e6:,.0f} MB; "
        + ", ".join(f"{k} {v / 1e6:,.0f} MB ({v / once:.2f}x)" for k, v in saved.items())
    )


if __name__ == "__main__":
    main()
