"""The maps whose rows are the class token's: class attention (CaiT's class-attention stage), the
class token's row in self-attention (ViT), or an attention-pooling head's latent queries."""

from __future__ import annotations

from ..hooks import HookedModel
from ._model import class_attention_names, pooling_attention_names, self_attention_names

__all__ = ["class_rows"]


def class_rows(hm: HookedModel, image_size: tuple[int, int]) -> tuple[list[str], str, int]:
    """The maps whose rows are the class token's (or a pooling head's): names, what they are,
    and the default layer."""
    class_stage = class_attention_names(hm)
    if class_stage:
        return class_stage, "class-attention", 0
    self_names = self_attention_names(hm)
    if self_names and hm.token_layout(image_size, self_names[-1]).class_token:
        return self_names, "attention", -1
    pool = pooling_attention_names(hm)
    if pool:
        return pool, "pooling-head", 0
    raise ValueError(
        f"{type(hm.model).__name__} has no class token and no attention-pooling head, so there "
        "is no class attention. Use rollout() or gradcam() instead."
    )
