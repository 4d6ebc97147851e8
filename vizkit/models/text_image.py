"""A text-image model small enough to train on a CPU: open_clip's ``CLIP`` at a tiny
configuration (a ViT image tower on 32 px images, a text transformer over `WordTokenizer` ids),
so that every view that takes an open_clip model takes it (open_clip is imported when built).
`BUILDERS` names it for the zoo's cards; `shapes_zero_shot` makes the zoo model a classifier of
the Shapes classes by its card's prompt."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from ..datasets.shapes import SHAPES_MEAN, SHAPES_STD

__all__ = ["BUILDERS", "clip_shapes", "shapes_zero_shot"]


def clip_shapes(
    vocab_size: int, context_length: int, embed_dim: int = 64, width: int = 128,
    layers: int = 4, heads: int = 4, patch_size: int = 4, image_size: int = 32,
    text_width: int = 128, text_layers: int = 2,
    mean: Sequence[float] = SHAPES_MEAN, std: Sequence[float] = SHAPES_STD,
) -> nn.Module:  # fmt: skip
    """An open_clip ``CLIP``: image tower ViT (``layers`` x ``width``, ``patch_size`` patches of
    ``image_size`` images), text tower (``text_layers`` x ``text_width``, ``vocab_size`` ids,
    ``context_length`` per text, the end token the largest id), joint space ``embed_dim``. Its
    ``visual.preprocess_cfg`` records the images' ``mean`` and ``std`` (Shapes'), as open_clip's
    factory records a pretrained model's, so vizkit prepares photos with them."""
    import open_clip

    model = open_clip.model.CLIP(
        embed_dim=embed_dim,
        vision_cfg={"image_size": image_size, "patch_size": patch_size, "width": width,
                    "layers": layers, "head_width": width // heads, "mlp_ratio": 3},
        text_cfg={"context_length": context_length, "vocab_size": vocab_size,
                  "width": text_width, "heads": heads, "layers": text_layers},
    )  # fmt: skip
    model.visual.preprocess_cfg = {
        "size": image_size, "mode": "RGB", "mean": tuple(mean), "std": tuple(std),
        "interpolation": "bilinear", "resize_mode": "squash",
    }  # fmt: skip
    return model


# zoo architectures that are not timm's: a card's "architecture" -> its builder (card "kwargs")
BUILDERS: dict[str, Callable[..., nn.Module]] = {"clip_shapes": clip_shapes}


def shapes_zero_shot(model: nn.Module, card: dict) -> nn.Module:
    """The zoo text-image ``model`` as a classifier of its card's classes: each class's prompt
    (the card's ``zero_shot.template``) embedded by its text tower (`vizkit.models.zero_shot`)."""
    from ..datasets.captions import WordTokenizer
    from ..targets import encode_texts
    from .zero_shot import zero_shot

    tokenizer = WordTokenizer.from_dict(card["tokenizer"])
    prompts = [card["zero_shot"]["template"].format(c) for c in card["classes"]]
    return zero_shot(model, encode_texts(model, prompts, tokenizer))
