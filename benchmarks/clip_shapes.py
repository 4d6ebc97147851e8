"""How far contrastive training of the small text-image model gets on Shapes captions: the
zero-shot shape accuracy from class prompts after each epoch (issue 55's model, not yet in the
zoo; this measures what a recipe should ask for).

``--train`` images of the training split with their captions (`ShapeCaptions`), the model of
`vizkit.models.text_image.clip_shapes` (ViT 4 x 128 on 32 px, text 2 x 128, joint space 64),
AdamW at ``--lr``, batches of ``--batch``, a half-epoch warm-up and cosine decay; after each
epoch the zero-shot accuracy of the prompt "a <shape>" on ``--test`` test images. Writes the
weights to ``--out`` when given.
Usage: python benchmarks/clip_shapes.py [--train 20000] [--epochs 12] [--batch 256]
       [--lr 1e-3] [--test 1000] [--out clip.pt]
"""

from __future__ import annotations

import argparse
import time

import torch

from vizkit.datasets import SHAPE_CLASSES
from vizkit.datasets.captions import ShapeCaptions, WordTokenizer
from vizkit.models.text_image import clip_shapes
from vizkit.train.contrastive import ContrastiveConfig, train_contrastive, zero_shot_accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=20_000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out")
    args = parser.parse_args()
    train, test = ShapeCaptions("train", n=args.train), ShapeCaptions("test", n=args.test)
    images = torch.stack([train[i][0] for i in range(len(train))])
    test_images = torch.stack([test[i][0] for i in range(len(test))])
    tokenizer = WordTokenizer()
    torch.manual_seed(0)
    model = clip_shapes(tokenizer.vocab_size, tokenizer.context_length)

    def zero_shot(m: torch.nn.Module) -> dict:
        return {"zero_shot": zero_shot_accuracy(m, tokenizer, test_images, test.labels,
                                                SHAPE_CLASSES)}  # fmt: skip

    config = ContrastiveConfig(epochs=args.epochs, batch_size=args.batch, lr=args.lr)
    start = time.perf_counter()
    history = train_contrastive(model, tokenizer, images, train.captions, config, zero_shot,
                                progress=False)  # fmt: skip
    print(f"{args.train} captioned images, {args.epochs} epochs of batches of {args.batch}, "
          f"{time.perf_counter() - start:.0f} s, {torch.get_num_threads()} threads")  # fmt: skip
    for record in history:
        print(f"epoch {record['epoch']:>2}: loss {record['loss']:.3f}, temperature "
              f"{record['logit_scale']:.1f}, zero-shot {record['zero_shot']:.1%}")  # fmt: skip
    if args.out:
        torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
