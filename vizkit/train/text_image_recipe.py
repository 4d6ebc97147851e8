"""The text-image recipe (``"objective": "contrastive"``): the zoo's CLIP of Shapes captions,
trained by `train_contrastive`, with what its card records beyond a classifier's: the
tokenizer, the zero-shot prompt and the zero-shot accuracy on the Shapes test split."""

from __future__ import annotations

import torch
from torch import nn

from ..datasets.captions import ShapeCaptions, WordTokenizer
from ..datasets.shapes import SHAPE_CLASSES, SHAPES_MEAN, SHAPES_STD
from ..models.text_image import BUILDERS
from .contrastive import ContrastiveConfig, train_contrastive, zero_shot_accuracy

__all__ = ["TEMPLATE", "train_text_image"]

TEMPLATE = "a {}"  # the zero-shot prompt of each class


def train_text_image(
    spec: dict, config: ContrastiveConfig, progress: bool, device: str
) -> tuple[nn.Module, list[dict], dict]:
    """Train recipe ``spec``: (the model on the CPU, its history, its card's own fields)."""
    tokenizer = WordTokenizer()
    train, test = ShapeCaptions("train", n=config.images), ShapeCaptions("test")
    images = torch.stack([train[i][0] for i in range(len(train))])
    test_images = torch.stack([test[i][0] for i in range(len(test))])
    kwargs = {**spec["kwargs"], "vocab_size": tokenizer.vocab_size,
              "context_length": tokenizer.context_length}  # fmt: skip
    torch.manual_seed(config.seed)
    model = BUILDERS[spec["architecture"]](**kwargs).to(device)

    def zero_shot(m: nn.Module) -> dict:
        accuracy = zero_shot_accuracy(m, tokenizer, test_images, test.labels, SHAPE_CLASSES,
                                      TEMPLATE)  # fmt: skip
        return {"test_accuracy": accuracy}

    history = train_contrastive(model, tokenizer, images, train.captions, config, zero_shot,
                                progress, device)  # fmt: skip
    card = {
        "kwargs": kwargs,
        "pretrained_cfg": {"input_size": list(images.shape[1:]), "mean": list(SHAPES_MEAN),
                           "std": list(SHAPES_STD)},
        "classes": list(SHAPE_CLASSES),
        "tokenizer": tokenizer.to_dict(),
        "zero_shot": {"template": TEMPLATE},
        "data": {"name": "shapes", "captions": "vizkit.datasets.captions.ShapeCaptions",
                 "train": len(train), "test": len(test)},
        "test_accuracy": history[-1]["test_accuracy"],
    }  # fmt: skip
    return model.cpu(), history, card
