"""What TextSpan says about the zoo's text-image model (issue 55): the zero-shot accuracy, the
accuracy left when parts are mean-ablated, each head's texts (from `descriptions`, the 210
one-attribute captions) with the variance they explain and the share of its variance each of
the generator's attributes explains, and the zero-shot segmentation maps scored against the
object masks (chance: a map that ranks pixels at random).

Usage: python benchmarks/text_span_shapes.py [--model clip_shapes] [--images 1000] [--basis 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from vizkit import zoo
from vizkit.datasets import SHAPE_CLASSES
from vizkit.datasets.captions import ShapeCaptions, WordTokenizer, descriptions
from vizkit.metrics.localization import pointing_game, relevance_rank_accuracy, top_iou
from vizkit.targets import encode_texts
from vizkit.text import decompose_images, label_shares, mean_ablation, text_maps, text_span

ATTRIBUTES = ("shape", "size", "tone", "tint", "position")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="clip_shapes", help="zoo name or .safetensors path")
    parser.add_argument("--images", type=int, default=1000, help="Shapes test images")
    parser.add_argument("--basis", type=int, default=3, help="texts per head")
    args = parser.parse_args()
    model, card = zoo.load(args.model)
    tokenizer = WordTokenizer.from_dict(card["tokenizer"])
    test = ShapeCaptions("test", n=args.images)
    images = torch.stack([test[i][0] for i in range(len(test))])
    start = time.perf_counter()
    decomposition = decompose_images(
        model, images, batch_size=100, tokens=slice_all(model), progress=False
    )
    seconds = time.perf_counter() - start
    prompts = [card["zero_shot"]["template"].format(c) for c in SHAPE_CLASSES]
    classes = encode_texts(model, prompts, tokenizer)
    print(f"{len(images)} test images decomposed in {seconds:.1f} s "
          f"({torch.get_num_threads()} threads)")  # fmt: skip

    ablation = mean_ablation(decomposition, classes, test.labels)
    print("\nzero-shot accuracy with parts mean-ablated")
    for name, accuracy in zip(ablation.names, ablation.accuracy.tolist(), strict=True):
        print(f"  {accuracy:6.1%}  {short(name)}")

    span = text_span(model, decomposition, descriptions(), tokenizer, basis=args.basis)
    labels = {k: [a[k] for a in test.attributes] for k in ATTRIBUTES}
    shares = label_shares(decomposition, labels)
    print("\n| head | texts (TextSpan) | explained | variance | " + " | ".join(ATTRIBUTES) + " |")
    print("|---|---|---|---|" + "---|" * len(ATTRIBUTES))
    for row in span.table():
        b = decomposition.blocks.index(row["block"])
        attributes = " | ".join(f"{float(v):.2f}" for v in shares.shares[b, row["head"]])
        print(f"| {short(row['block'])}.{row['head']} | {'; '.join(row['texts'])} | "
              f"{row['explained']:.2f} | {row['variance']:.4f} | {attributes} |")  # fmt: skip

    masks = test.shapes.masks
    print("\nzero-shot segmentation (class prompt; every head of the blocks named)")
    for blocks in (decomposition.blocks[-1:], decomposition.blocks):
        maps = text_maps(decomposition, classes, test.labels, blocks=blocks)
        noise = torch.rand(maps.maps.shape, generator=torch.Generator().manual_seed(0))
        scores = [(f(maps, masks).mean(), f(noise, masks).mean())
                  for f in (pointing_game, top_iou, relevance_rank_accuracy)]  # fmt: skip
        print(f"  {', '.join(short(b) for b in blocks)}: pointing {scores[0][0]:.3f} (random "
              f"{scores[0][1]:.3f}), top IoU {scores[1][0]:.3f} ({scores[1][1]:.3f}), rank "
              f"accuracy {scores[2][0]:.3f} ({scores[2][1]:.3f})")  # fmt: skip


def slice_all(model: torch.nn.Module) -> list[int]:
    """Every block of the image tower, for the token split."""
    return list(range(len(model.visual.transformer.resblocks)))


def short(name: str) -> str:
    """``model.visual.transformer.resblocks.3 attn`` -> ``block 3 attn``."""
    return name.replace("model.visual.transformer.resblocks.", "block ")


if __name__ == "__main__":
    main()
