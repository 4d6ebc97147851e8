"""Naming many units at data-set scale: Network Dissection and CLIP-Dissect of an autoencoder's
``--latents`` latents over ``--images`` probe images, read from an activation store, each timed
against one pass over the store (its rows read and encoded by the autoencoder: what any
analysis of the latents needs) and against the forward that wrote the store.

Models: the zoo's vit_tiny_shapes on its 32 px test images (``--model shapes``), or a
random-init ViT-B/16 (timm, 1,000 classes) on the same images upsampled to 224 px
(``--model vit_b``; the concept masks upsampled by nearest neighbour). The autoencoder
(TopK, k = 32, latents the nearest multiple of the layer's width) is trained briefly on the
store: the timings do not depend on what it learned. The CLIP similarities are clip_shapes's
on the 32 px images, computed once beforehand (timed without loading the model).

Usage: python benchmarks/concept_scale.py [--model shapes|vit_b] [--images 2000]
       [--latents 4096] [--device cpu|cuda] [--batch 64]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import timm
import torch
import torch.nn.functional as F

import vizkit as vk
from vizkit.concepts import clip_dissect, dissect, shapes_concepts
from vizkit.concepts.units import read_units
from vizkit.datasets.captions import WordTokenizer
from vizkit.models.zero_shot import image_tower
from vizkit.targets import embed, encode_texts

LAYER = {"shapes": "blocks.3.hook_resid_post", "vit_b": "blocks.11.hook_resid_post"}


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    out = call()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def clip_similarities(
    clip: torch.nn.Module, tokenizer: WordTokenizer, images: torch.Tensor, texts: list[str],
    device: str,
) -> torch.Tensor:  # fmt: skip
    """(N, M) clip_shapes's cosine similarities of the 32 px ``images`` with ``texts``."""
    text = encode_texts(clip, texts, tokenizer).float()
    image = F.normalize(embed(image_tower(clip), images.to(device)).float(), dim=-1)
    return (image @ text.to(image.device).T).cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(LAYER), default="shapes")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--latents", type=int, default=4096)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    images, concepts = shapes_concepts(args.images)
    if args.model == "shapes":
        model, card = vk.zoo.load("vit_tiny_shapes")
        probe, masks = images, concepts.masks
    else:
        torch.manual_seed(0)
        model = timm.create_model("vit_base_patch16_224", num_classes=1000)
        probe = F.interpolate(images, size=224, mode="bilinear", align_corners=False)
        masks = F.interpolate(concepts.masks.float(), size=224, mode="nearest").bool()
    model = model.to(args.device).eval()
    concepts = vk.concepts.Concepts(concepts.names, masks)
    layer = LAYER[args.model]
    texts = [f"a {c}" for c in vk.zoo.card("vit_tiny_shapes")["classes"]]
    folder = tempfile.mkdtemp(prefix="vizkit-concept-scale-")
    try:
        write, store = timed(lambda: vk.cache_activations(
            model, probe, f"{folder}/s", layers=[layer], tokens="patches",
            batch_size=args.batch, progress=False))  # fmt: skip
        width = store.layer(layer).width
        expansion = max(1, round(args.latents / width))  # ViT-B: 5 x 768 = 3,840 latents
        sae = vk.train_sae(store, expansion=expansion, k=32, tokens=4 * args.batch * 64,
                           batch_size=1024, device=args.device, progress=False)  # fmt: skip
        hm = vk.HookedModel(model)
        units = read_units(hm, sae, tuple(masks.shape[-2:]), None, store)

        def one_pass() -> None:
            for start in range(0, args.images, args.batch):
                units.read(None, range(start, min(start + args.batch, args.images)))

        read, _ = timed(one_pass)
        clip, clip_card = vk.zoo.load("clip_shapes")
        tokenizer = WordTokenizer.from_dict(clip_card["tokenizer"])
        similarities_time, image_text = timed(lambda: clip_similarities(
            clip.to(args.device).eval(), tokenizer, images, texts, args.device))  # fmt: skip
        dissect_time, found = timed(
            lambda: dissect(
                model, None, concepts, sae, batch_size=args.batch, store=store, progress=False
            )
        )
        clip_time, named = timed(lambda: clip_dissect(
            model, None, texts, sae, image_text=image_text, batch_size=args.batch, store=store,
            progress=False))  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{args.model}: {layer}, {sae.latents} latents, {args.images} images "
          f"{tuple(masks.shape[-2:])}, {len(concepts.names)} concepts, {args.device}")  # fmt: skip
    print(f"forward writing the store  {write:8.1f} s")
    print(f"one pass over the store    {read:8.1f} s (rows read, latents encoded)")
    print(f"clip_shapes similarities   {similarities_time:8.1f} s")
    for what, seconds in (("dissect", dissect_time), ("clip_dissect", clip_time)):
        print(f"{what:<26} {seconds:8.1f} s  {seconds / read:6.1f}x the store pass, "
              f"{seconds / write:5.2f}x the forward")  # fmt: skip
    print(f"detectors {int(found.detectors.sum())} of {len(found.units)}; "
          f"CLIP names {len(set(named.labels))} distinct")  # fmt: skip


if __name__ == "__main__":
    main()
