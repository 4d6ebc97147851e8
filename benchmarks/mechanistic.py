"""The mechanistic views' cost against plain forwards of as many images (the limit), and a full
layer x position patching sweep against the loop that runs one patched forward per site.

Model: the shipped vit_tiny_shapes (4 blocks, 65 tokens); images: 8 of the Shapes sample, the
corrupted ones with the object erased. The sweep patches 4 x 65 = 260 sites, 2,080 images.
Each round runs every entry once, order rotated; the median over rounds is reported.
Usage: python benchmarks/mechanistic.py [--images 8] [--repeats 3] [--device cpu] [--record]
"""

from __future__ import annotations

import argparse

import torch
from timing import add_device_options, device_name, print_table, rotated_rounds

import vizkit as vk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = add_device_options(parser).parse_args()
    model, _ = vk.zoo.load("vit_tiny_shapes")
    model = model.eval().to(args.device)
    x, labels, masks = vk.datasets.load_sample()
    x, masks = x[: args.images].to(args.device), masks[: args.images].to(args.device)
    erased = x * (~masks[:, None]).float()
    hm = vk.HookedModel(model)
    blocks = [f"blocks.{i}.hook_resid_pre" for i in range(len(model.blocks))]
    tokens = 65
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, blocks)

    def forward(count: int):
        copies = x.repeat(count // len(x), 1, 1, 1)

        def run():
            with torch.no_grad():
                for part in copies.split(64):
                    model(part)

        return run

    def loop():  # one forward of the batch per patched site, as an explicit sweep runs
        for name in blocks:
            for p in range(tokens):

                def patch(t, *, name, p=p):  # noqa: E306
                    t = t.clone()
                    t[:, p] = cache[name][:, p]
                    return t

                with torch.no_grad(), hm.hooks(fwd={name: patch}):
                    model(erased)

    sites = len(blocks) * tokens
    runs = {
        "forward": forward(sites * len(x)),
        "sweep": lambda: vk.activation_patching(
            model, x, erased, sites=("resid",), progress=False
        ),  # fmt: skip
        "loop": loop,
        "dla": lambda: vk.direct_logit_attribution(model, x),
        "lens": lambda: vk.logit_lens(model, x),
    }
    times, faults = rotated_rounds(runs, args.repeats, args.device, untimed=0)
    title = (
        f"Mechanistic views on vit_tiny_shapes, {len(x)} images; forward: {sites * len(x):,} "
        f"images (the sweep's {sites} patched copies of the batch) in batches of 64; sweep: "
        f"vk.activation_patching over the stream entering each block x each position; loop: "
        f"one patched forward of the batch per site; dla: with the per-head split; "
        f"{device_name(args.device)}, torch {torch.__version__}; median of {args.repeats} rounds"
    )
    print_table(times, faults, "forward", args, title)


if __name__ == "__main__":
    main()
