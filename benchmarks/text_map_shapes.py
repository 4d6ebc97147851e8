"""A backbone without a text tower read in the zoo's text-image space (issue 55, item 3): the
supervised Shapes ViT without its classifier, a linear map fitted from its embedding to
clip_shapes' on training images (`vk.text.fit_text_map`), scored on held-out ones; zero-shot
readings (shape, tone, size) of test images through the map against the CLIP's own.

Usage: python benchmarks/text_map_shapes.py [--fit 3000] [--test 1000]
"""

from __future__ import annotations

import argparse

import timm
import torch

import vizkit as vk
from vizkit.datasets.captions import ShapeCaptions, WordTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=int, default=3000, help="training images (a fifth held out)")
    parser.add_argument("--test", type=int, default=1000)
    args = parser.parse_args()
    clip, card = vk.zoo.load("clip_shapes")
    tokenizer = WordTokenizer.from_dict(card["tokenizer"])
    backbone = headless("vit_tiny_shapes")
    fit, test = ShapeCaptions("train", n=args.fit), ShapeCaptions("test", n=args.test)
    images = torch.stack([fit[i][0] for i in range(len(fit))])
    test_images = torch.stack([test[i][0] for i in range(len(test))])
    fitted = vk.text.fit_text_map(backbone, clip, images)
    print("map:", ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in fitted.scores.items()))  # fmt: skip
    with torch.no_grad():
        embeddings = {"through the map": fitted(backbone(test_images)),
                      "clip_shapes itself": clip.encode_image(test_images)}  # fmt: skip
    classes = card["classes"]
    readings = {"shape": [f"a {c}" for c in classes]}
    for attribute, words in (("tone", ("dark", "light")), ("size", ("small", "large"))):
        readings[attribute] = [[f"a {w} {c}" for c in classes] for w in words]
    for attribute, prompts in readings.items():
        if attribute == "shape":
            texts, labels = vk.targets.encode_texts(clip, prompts, tokenizer), test.labels
        else:  # each word's prompts averaged over the shapes
            texts = torch.stack([vk.targets.text_embedding(clip, p, tokenizer) for p in prompts])
            words = [p[0].split()[1] for p in prompts]
            labels = torch.tensor([words.index(a[attribute]) for a in test.attributes])
        for name, embedding in embeddings.items():
            right = vk.text.zero_shot_predictions(embedding, texts) == labels
            print(f"{attribute:<6} zero-shot, {name}: {float(right.float().mean()):.1%}")


def headless(name: str) -> torch.nn.Module:
    """Zoo classifier ``name`` rebuilt without its classifier (num_classes=0): its pooled
    embedding."""
    model, card = vk.zoo.load(name)
    backbone = timm.create_model(card["architecture"], **{**card["kwargs"], "num_classes": 0})
    backbone.load_state_dict({k: v for k, v in model.state_dict().items()
                              if not k.startswith("head.")})  # fmt: skip
    return backbone.eval()


if __name__ == "__main__":
    main()
