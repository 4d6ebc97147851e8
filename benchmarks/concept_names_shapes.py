"""How well each naming method names the Shapes ViT's units after what they detect, against the
generator's truth: for each unit kind (the last block's stream channels, its MLP neurons, the
latents of an autoencoder on the last block) and each shape class, the unit whose per-image
maximum best tells held-out images of that class from the others (ROC AUC; the truth), and
whether Network Dissection, CLIP-Dissect (soft-WPMI with the zoo's clip_shapes, one text per
class) and saev's 1-D probes name that unit (or, for probes, choose it) after the class.

Splits: the units are named on ``--probe`` Shapes test images (seed 0), the truth measured on
``--held`` others (seed 1), the autoencoder trained on ``--train`` training images (all tokens,
expansion 4, k = 8, as benchmarks/sae_shapes.py), the probes fitted on the probe split and
measured on the held-out one (their first 300 images each; the column is the mean held-out
AUC of the units the probes choose, beside the truth's best). Stores are written once; every method
but the probes reads them (its split sizes show the cost of a dense fit).
Usage: python benchmarks/concept_names_shapes.py [--probe 1000] [--held 1000] [--train 2000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import torch

import vizkit as vk
from vizkit.concepts import (
    PatchLabels,
    clip_dissect,
    dissect,
    image_auc,
    image_maxima,
    patch_labels,
    probe_units,
    shapes_concepts,
)
from vizkit.concepts.probe_set import probe_set
from vizkit.datasets.captions import WordTokenizer
from vizkit.models.zero_shot import image_tower

LAYER = "blocks.3.hook_resid_post"
FIT_IMAGES = 300  # the probes' splits: 19,200 patches each
KINDS = {"channels": LAYER, "neurons": "blocks.3.mlp.act.hook_out", "latents": None}


def labelled(count: int, seed: int, classes: list[str]) -> tuple:
    """Test images, their concepts, class labels and patch labels (object: its class, else
    background)."""
    images, concepts = shapes_concepts(count, seed=seed)
    data = vk.datasets.Shapes("test", n=count, seed=seed)
    pixels = torch.where(data.masks, data.labels[:, None, None].long(), len(classes))
    return images, concepts, data.labels, patch_labels(pixels, (8, 8), [*classes, "background"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", type=int, default=1000)
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument("--train", type=int, default=2000)
    args = parser.parse_args()
    model, card = vk.zoo.load("vit_tiny_shapes")
    clip, clip_card = vk.zoo.load("clip_shapes")
    tokenizer = WordTokenizer.from_dict(clip_card["tokenizer"])
    classes = card["classes"]
    images, concepts, _, labels = labelled(args.probe, 0, classes)
    held, held_concepts, held_labels, held_patches = labelled(args.held, 1, classes)
    folder = tempfile.mkdtemp(prefix="vizkit-concept-names-")
    try:
        train = vk.datasets.Shapes("train", n=args.train)
        train_images = torch.stack([train[i][0] for i in range(args.train)])
        store = vk.cache_activations(model, train_images, f"{folder}/train", layers=[LAYER],
                                     tokens="all", progress=False)  # fmt: skip
        KINDS["latents"] = vk.train_sae(store, expansion=4, k=8, tokens=5 * len(store),
                                        batch_size=1024, progress=False)  # fmt: skip
        layers = [LAYER, KINDS["neurons"]]
        probe_store = vk.cache_activations(model, images, f"{folder}/probe", layers=layers,
                                           tokens="patches", progress=False)  # fmt: skip
        held_store = vk.cache_activations(model, held, f"{folder}/held", layers=layers,
                                          tokens="patches", progress=False)  # fmt: skip
        texts = [f"a {c}" for c in classes]
        similarity = _similarities(clip, tokenizer, images, texts)
        present = torch.nn.functional.one_hot(held_labels, len(classes)).bool()
        print(f"vit_tiny_shapes, {args.probe} probe / {args.held} held-out test images; "
              "units named after the class of their best held-out AUC, of 10")  # fmt: skip
        print(
            f"{'units':<9} {'count':>5} {'truth AUC':>9} {'dissection':>10} "
            f"{'CLIP-Dissect':>12} {'probe AUC':>10}  seconds (dissect, clip, probes)"
        )
        for kind, units in KINDS.items():
            _row(model, kind, units, images, concepts, labels, held, held_patches, present,
                 similarity, texts, classes, probe_store, held_store)  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _similarities(clip, tokenizer, images, texts) -> torch.Tensor:
    """(N, M) clip_shapes' cosine similarities of the probe images with the texts."""
    tower = image_tower(clip)
    with torch.no_grad():
        image = torch.nn.functional.normalize(vk.targets.embed(tower, images, 256), dim=-1)
        text = vk.targets.encode_texts(clip, texts, tokenizer)
    return image.float() @ text.float().T


def _row(model, kind, units, images, concepts, labels, held, held_patches, present,
         similarity, texts, classes, probe_store, held_store) -> None:  # fmt: skip
    layer = units if isinstance(units, str) else units.source["layer"]
    store = probe_store
    start = time.perf_counter()
    found = dissect(model, None if store else images, concepts, units, store=store,
                    progress=False)  # fmt: skip
    took = [time.perf_counter() - start]
    start = time.perf_counter()
    named = clip_dissect(model, None if store else images, texts, units, image_text=similarity,
                         store=store, progress=False)  # fmt: skip
    took.append(time.perf_counter() - start)
    start = time.perf_counter()
    fit = FIT_IMAGES
    probes = probe_units(model, units, images[:fit], _first(labels, fit), held[:fit],
                         _first(held_patches, fit), progress=False)  # fmt: skip
    took.append(time.perf_counter() - start)
    values = _held_maxima(model, units, held, held_store)
    auc = image_auc(values, present)  # (10, U)
    best = auc.nan_to_num(0).argmax(1)  # each class's truth unit
    by_dissection = sum(found.labels[int(u)] == c for u, c in zip(best, classes, strict=True))
    by_clip = sum(named.labels[int(u)] == f"a {c}" for u, c in zip(best, classes, strict=True))
    probe_auc = float(sum(auc[c, int(probes.best[c])] for c in range(len(classes)))) / 10
    print(
        f"{kind:<9} {len(found.units):>5} {float(auc.max(1).values.mean()):>9.3f} "
        f"{by_dissection:>10} {by_clip:>12} {probe_auc:>10.3f}  "
        f"{' '.join(f'{t:.0f}' for t in took)}   ({layer})"
    )


def _first(labels: PatchLabels, count: int) -> PatchLabels:
    return PatchLabels(labels.classes, labels.labels[:count])


def _held_maxima(model, units, held, store) -> torch.Tensor:
    """(N, U) each unit's largest value over each held-out image's patches."""
    hm = vk.hooks.HookedModel(model)
    found = vk.concepts.units.read_units(hm, units, (32, 32), held[:1], store)
    return image_maxima(found, probe_set(held, 256, "benchmark", store))


if __name__ == "__main__":
    main()
