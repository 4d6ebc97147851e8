"""A text-image model small enough to train on a CPU: open_clip's ``CLIP`` at a tiny
configuration (a ViT image tower on 32 px images, a text transformer over `WordTokenizer` ids),
so that every view that takes an open_clip model takes it (open_clip is imported when built)."""

from __future__ import annotations

from torch import nn

__all__ = ["clip_shapes"]


def clip_shapes(
    vocab_size: int, context_length: int, embed_dim: int = 64, width: int = 128,
    layers: int = 4, heads: int = 4, patch_size: int = 4, image_size: int = 32,
    text_width: int = 128, text_layers: int = 2,
) -> nn.Module:  # fmt: skip
    """An open_clip ``CLIP``: image tower ViT (``layers`` x ``width``, ``patch_size`` patches of
    ``image_size`` images), text tower (``text_layers`` x ``text_width``, ``vocab_size`` ids,
    ``context_length`` per text, the end token the largest id), joint space ``embed_dim``."""
    import open_clip

    return open_clip.model.CLIP(
        embed_dim=embed_dim,
        vision_cfg={"image_size": image_size, "patch_size": patch_size, "width": width,
                    "layers": layers, "head_width": width // heads, "mlp_ratio": 3},
        text_cfg={"context_length": context_length, "vocab_size": vocab_size,
                  "width": text_width, "heads": heads, "layers": text_layers},
    )  # fmt: skip
