"""Captions of Shapes images, written from what the generator drew (its labels and object masks)
and the pixels: the shape's class, its tone (the generator draws it dark on a light background
or light on a dark one), its tint, where it lies and how large it is. A text-image model trained
on them can be asked for a shape, a colour or a place in words.

Each image's caption names its shape and, each with probability one half (drawn from the
image's index), its size, tone, tint and position, in the order "a small dark red star at the
top left"; `WordTokenizer` turns captions into token ids over `VOCABULARY`.
"""

from __future__ import annotations

import colorsys
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .shapes import SHAPE_CLASSES, Shapes

__all__ = [
    "POSITIONS",
    "VOCABULARY",
    "ShapeCaptions",
    "WordTokenizer",
    "caption",
    "descriptions",
    "shape_attributes",
]

POSITIONS = (("top left", "top", "top right"), ("left", "center", "right"),
             ("bottom left", "bottom", "bottom right"))  # fmt: skip
TINTS = ("red", "yellow", "green", "cyan", "blue", "purple")  # hue sixths, from red
LARGE_FROM = 0.56  # the object's extent (of the image side) from which it is "large": the median
GREY_BELOW = 0.1  # colour spread (max - min channel, 0..1) below which the tint is "grey"
VOCABULARY = tuple(dict.fromkeys(
    ["a", "photo", "of", "at", "the", "small", "large", "dark", "light", "grey", *TINTS,
     *SHAPE_CLASSES, *" ".join(p for row in POSITIONS for p in row).split()]
))  # fmt: skip


def shape_attributes(images: np.ndarray, labels: np.ndarray, masks: np.ndarray) -> list[dict]:
    """Per image (images (n, H, W, 3) uint8, labels (n,), masks (n, H, W) bool): its "shape",
    "size" (small or large), "tone" (dark or light), "tint" (one of `TINTS` or grey) and
    "position" (one of `POSITIONS`)."""
    out = []
    side = images.shape[1]
    for image, label, mask in zip(images, labels, masks, strict=True):
        ys, xs = np.nonzero(mask)
        extent = (max(np.ptp(ys), np.ptp(xs)) + 1) / side
        row, col = (min(2, int(v.mean() / side * 3)) for v in (ys, xs))
        colour = image[mask].mean(0) / 255
        hue, _, _ = colorsys.rgb_to_hsv(*colour)
        grey = colour.max() - colour.min() < GREY_BELOW
        out.append({
            "shape": SHAPE_CLASSES[int(label)],
            "size": "large" if extent >= LARGE_FROM else "small",
            "tone": "dark" if colour.mean() < 0.5 else "light",
            "tint": "grey" if grey else TINTS[int((hue * 6 + 0.5) % 6)],
            "position": POSITIONS[row][col],
        })  # fmt: skip
    return out


def caption(attributes: dict, seed: int) -> str:
    """The caption of one image's ``attributes``: its shape, and each other attribute with
    probability one half (drawn from ``seed``)."""
    keep = np.random.default_rng(seed).random(4) < 0.5
    words = [attributes[k] for k, kept in zip(("size", "tone", "tint"), keep[:3], strict=True)
             if kept]  # fmt: skip
    text = " ".join(["a", *words, attributes["shape"]])
    return text + (f" at the {attributes['position']}" if keep[3] else "")


def descriptions() -> list[str]:
    """The texts that describe one attribute of a Shapes image besides its shape, in caption
    grammar: "a star", "a small star", "a red star", "a star at the top left", ... (a pool for
    TextSpan: 210 texts)."""
    words = ("small", "large", "dark", "light", "grey", *TINTS)
    texts = []
    for shape in SHAPE_CLASSES:
        texts.append(f"a {shape}")
        texts += [f"a {word} {shape}" for word in words]
        texts += [f"a {shape} at the {place}" for row in POSITIONS for place in row]
    return texts


class ShapeCaptions(Dataset):
    """A Shapes split with a caption per image: items ``(image (3, H, W) normalized, caption)``;
    ``attributes`` holds what each caption was written from, ``labels`` the classes."""

    def __init__(self, split: str = "train", n: int | None = None, seed: int = 0) -> None:
        self.shapes = Shapes(split, n=n, seed=seed)
        images = self.shapes.images.permute(0, 2, 3, 1).numpy()
        self.labels = self.shapes.labels
        self.attributes = shape_attributes(images, self.labels.numpy(), self.shapes.masks.numpy())
        offset = {"train": 0, "test": 1_000_003}[split]
        self.captions = [caption(a, offset + i) for i, a in enumerate(self.attributes)]

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, i: int) -> tuple[Tensor, str]:
        return self.shapes[i][0], self.captions[i]


class WordTokenizer:
    """Texts to token ids over a fixed ``vocabulary``: 0 pads, 1 starts, each word its index + 2,
    and the end token the largest id (where open_clip's text tower reads a text's embedding:
    the argmax of the ids).

    Args:
        vocabulary: the words; context_length: ids per text (start and end included).
    """

    def __init__(self, vocabulary: Sequence[str] = VOCABULARY, context_length: int = 12) -> None:
        self.vocabulary = list(vocabulary)
        self.context_length = context_length
        self._ids = {word: i + 2 for i, word in enumerate(self.vocabulary)}
        self.end = len(self.vocabulary) + 2

    @property
    def vocab_size(self) -> int:
        return self.end + 1

    def __call__(self, texts: str | Sequence[str]) -> Tensor:
        """(B, context_length) int64 ids of ``texts`` (lower-cased, split on spaces)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        out = torch.zeros(len(texts), self.context_length, dtype=torch.long)
        for row, text in enumerate(texts):
            words = text.lower().split()
            unknown = [w for w in words if w not in self._ids]
            if unknown:
                raise ValueError(
                    f"{unknown} are not in this tokenizer's vocabulary ({len(self.vocabulary)} "
                    f"words: {', '.join(self.vocabulary[:12])}, ...); write the text with them."
                )
            if len(words) + 2 > self.context_length:
                raise ValueError(
                    f"{text!r} has {len(words)} words; at most {self.context_length - 2} fit."
                )
            ids = [1, *(self._ids[w] for w in words), self.end]
            out[row, : len(ids)] = torch.tensor(ids)
        return out

    def to_dict(self) -> dict:
        return {"vocabulary": self.vocabulary, "context_length": self.context_length}

    @classmethod
    def from_dict(cls, spec: dict) -> WordTokenizer:
        """The tokenizer `to_dict` wrote (a zoo card's ``tokenizer``)."""
        return cls(spec["vocabulary"], spec["context_length"])
