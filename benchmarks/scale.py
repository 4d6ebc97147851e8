"""The data-set-scale analyses at the size researchers run them (random init, the real shapes):
each one's time and peak memory as multiples of the forward (or forward and backward) it
needs, timed side by side in rotated rounds in one process. Peak memory: CUDA's peak allocated
on a GPU, the profiler's allocation events on the CPU (`tests/allocation_oracle.py`), each
above what was allocated before the call.

    python benchmarks/scale.py                 # every row, CPU
    python benchmarks/scale.py --rows decomposition --device cuda --record

Rows (``--rows`` takes their group names, comma-separated):
    decomposition: `embedding_decomposition` (heads; heads and the last block's tokens) of 2
        images at 224 px on open_clip ViT-B-16, transformers' CLIP at ViT-B/16 shape and
        SigLIP at ViT-B/16 shape, against the image tower's forward (goal: 1.5x, 2x).
    browser: `vk.sae.logit_effects` (1,000 classes) and opening `FeatureBrowser` on
        ViT-S/16 at 224 px with 1,000 classes, an autoencoder of 3,072 latents of its last
        block, against a forward of the browser's 16 images (goal: 3x to open); then each
        control's response (goal: under a second).
    store: `cache_activations` of four blocks' outputs (all tokens) of ViT-B/16 over 32
        images at 224 px against the forward of those images (goal: 1.1x), and `features` and
        `evaluate_sae` over the last block's rows (an autoencoder of 16 x 768 latents, k=32)
        against one encoding pass over them (goal: 1.5x).
    analyses (`scale_analyses.py`): the other data-set analyses at ViT-B/16.
    million (`scale_million.py`, only when named): `features` and `evaluate_sae` over a
        store of a million rows, each once beside one encoding pass, with its peak memory.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from scale_million import add_million_options, million_rows
from scale_ratios import side_by_side
from timing import add_device_options, device_name, print_and_record

import vizkit as vk

GROUPS = ("decomposition", "browser", "store", "analyses")
OPT_IN = ("million",)  # a run of its own: minutes per pass over a million rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(GROUPS), help="comma-separated groups")
    add_million_options(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    args = add_device_options(parser).parse_args()
    torch.set_num_threads(args.threads)
    chosen = [g for g in args.rows.split(",") if g]
    unknown = sorted(set(chosen) - set(GROUPS + OPT_IN))
    if unknown:
        parser.error(f"unknown rows {unknown}; these exist: {', '.join(GROUPS + OPT_IN)}")
    rows = []
    if "decomposition" in chosen:
        rows += decomposition_rows(args)
    if "browser" in chosen:
        rows += browser_rows(args)
    if "store" in chosen:
        rows += store_rows(args)
    if "analyses" in chosen:
        from scale_analyses import analysis_rows

        rows += analysis_rows(args)
    if "million" in chosen:
        rows += million_rows(args)
    title = (f"data-set scale ({', '.join(chosen)}), {device_name(args.device)}, torch "
             f"{torch.__version__}; multiples")  # fmt: skip
    columns = ["analysis", "limit", "limit s", "time", "peak", "goal"]
    print_and_record(args, title, columns, rows)


def decomposition_rows(args: argparse.Namespace) -> list[list]:
    rows = []
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0)).to(args.device)
    for name, build in (("open_clip ViT-B-16", _open_clip), ("transformers CLIP B/16", _clip),
                        ("transformers SigLIP B/16", _siglip)):  # fmt: skip
        model = build().to(args.device)
        tower = vk.models.image_tower(model)

        def forward(tower=tower) -> None:
            with torch.no_grad():
                tower(x)

        for what, tokens, goal in (("heads", None, "1.5x"), ("heads + last tokens", -1, "2x")):

            def decompose(model=model, tokens=tokens) -> None:  # noqa: E306
                vk.embedding_decomposition(model, x, tokens=tokens)

            base, ratio, memory = side_by_side(decompose, forward, args)
            rows.append([f"decomposition ({what}), {name}, batch 2", "image forward",
                         f"{base:.2f}", f"{ratio:.2f}x", f"{memory:.2f}x", goal])  # fmt: skip
    return rows


def browser_rows(args: argparse.Namespace) -> list[list]:
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", num_classes=1000).eval().to(args.device)
    images = torch.randn(16, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    images = images.to(args.device)

    def forward() -> None:
        with torch.no_grad():
            model(images)

    with tempfile.TemporaryDirectory() as folder:
        store = vk.cache_activations(model, images, f"{folder}/store", layers=[-1],
                                     tokens="all", progress=False)  # fmt: skip
        sae = vk.train_sae(store, expansion=8, k=16, tokens=2 * 16 * 197, batch_size=512,
                           device=args.device, progress=False)  # fmt: skip

        def effects() -> None:
            vk.sae.logit_effects(model, sae, images)

        def browser() -> None:
            vk.widgets.FeatureBrowser(model, sae, images)

        rows = []
        for what, call in (("logit_effects, 1,000 classes", effects), ("FeatureBrowser open",
                                                                       browser)):  # fmt: skip
            base, ratio, memory = side_by_side(call, forward, args)
            rows.append([f"{what}, ViT-S/16, {sae.latents} latents", "forward of 16 images",
                         f"{base:.2f}", f"{ratio:.2f}x", f"{memory:.2f}x",
                         "3x" if "open" in what else ""])  # fmt: skip
        shown = vk.widgets.FeatureBrowser(model, sae, images)
        latents = [value for _, value in shown.latent.options[1:6]]
        for control, values in ((shown.latent, latents), (shown.cls, [3, 500, 999]),
                                (shown.order, ["logit effect", "density"])):  # fmt: skip
            seconds = []
            for value in values:
                start = time.perf_counter()
                control.value = value
                seconds.append(time.perf_counter() - start)
            rows.append([f"FeatureBrowser: {control.description}, ViT-S/16", "1 s", "",
                         f"{max(seconds):.2f} s (max)", "", "1 s"])  # fmt: skip
    return rows


def store_rows(args: argparse.Namespace) -> list[list]:
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", num_classes=1000).eval().to(args.device)
    images = torch.randn(32, 3, 224, 224, generator=torch.Generator().manual_seed(2))

    def forward() -> None:
        with torch.no_grad():
            for batch in images.split(32):
                model(batch.to(args.device))

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        written = iter(range(10**6))

        def write() -> None:
            vk.cache_activations(model, images, f"{folder}/w{next(written)}",
                                 layers=[2, 5, 8, 11], tokens="all", progress=False)  # fmt: skip

        base, ratio, memory = side_by_side(write, forward, args)
        rows.append(["cache_activations, ViT-B/16, 4 blocks, all tokens, 32 images",
                     "forward of the images", f"{base:.2f}", f"{ratio:.2f}x", f"{memory:.2f}x",
                     "1.1x"])  # fmt: skip
        store = vk.cache_activations(model, images, f"{folder}/s", layers=[-1], tokens="all",
                                     progress=False)  # fmt: skip
        sae = vk.train_sae(store, expansion=16, k=32, tokens=4096, batch_size=4096,
                           device=args.device, progress=False)  # fmt: skip

        def encode() -> None:
            with torch.no_grad():
                for start in range(0, len(store), 4096):
                    sae.encode(store.rows(start, min(start + 4096, len(store))).to(args.device))

        for what, call in (("features", lambda: vk.sae.features(sae, store, progress=False)),
                           ("evaluate_sae", lambda: vk.sae.evaluate_sae(sae, store,
                                                                     progress=False))):  # fmt: skip
            base, ratio, memory = side_by_side(call, encode, args)
            rows.append([f"{what}, {len(store):,} rows of 768, {sae.latents:,} latents",
                         "one encoding pass", f"{base:.2f}", f"{ratio:.2f}x", f"{memory:.2f}x",
                         "1.5x"])  # fmt: skip
    return rows


def _open_clip() -> torch.nn.Module:
    import open_clip

    torch.manual_seed(0)
    return open_clip.create_model("ViT-B-16", pretrained=None).eval()


_VISION = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
           "num_attention_heads": 12, "image_size": 224, "patch_size": 16}  # fmt: skip
_TEXT = {"num_hidden_layers": 1}


def _clip() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.CLIPConfig(vision_config=_VISION, text_config=_TEXT, projection_dim=512)
    return transformers.CLIPModel(config).eval()


def _siglip() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.SiglipModel(
        transformers.SiglipConfig(vision_config=_VISION, text_config=_TEXT)
    ).eval()


if __name__ == "__main__":
    main()
