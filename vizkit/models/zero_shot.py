"""A CLIP-like model as a classifier over text prompts: explain an image by its similarity to a
prompt's embedding (Radford et al. 2021, "Learning Transferable Visual Models From Natural
Language Supervision", Sec. 3.1.2: zero-shot transfer)."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from ..hooks.family import Family, FamilyLayout, inner_layout, projected, register_family
from ..hooks.inputs import check_number
from ..targets import embedding_of

__all__ = ["ImageTower", "ZeroShotClassifier", "image_tower", "zero_shot", "zero_shot_predictions"]


class ZeroShotClassifier(nn.Module):
    """``model``'s image embeddings against K text embeddings, as (B, K) logits:
    ``scale * cos(image, text_k)``. Class index k is prompt k, so integer targets, the argmax
    and every analysis work as on a classifier; the image tower inside keeps its family's
    names (under ``model.``).

    Args:
        model: an open_clip CLIP (``encode_image``), or a transformers ``CLIPModel`` /
            ``SiglipModel`` (``get_image_features``).
        text_embeddings: (K, D) embeddings of the prompts, from the same model.
        scale: logits per unit of cosine similarity (default: the model's learned
            ``logit_scale``, exponentiated, else 100).
    """

    def __init__(self, model: nn.Module, text_embeddings: Tensor, scale: float | None = None):
        super().__init__()
        if isinstance(text_embeddings, dict):  # transformers >= 5.x: a ModelOutput
            text_embeddings = embedding_of(text_embeddings)
        if not isinstance(text_embeddings, Tensor) or text_embeddings.ndim != 2:
            got = (
                tuple(text_embeddings.shape)
                if isinstance(text_embeddings, Tensor)
                else type(text_embeddings).__name__
            )
            raise ValueError(
                f"text_embeddings must be (K, D), one row per prompt; got {got}. Encode the "
                "prompts with the model's text tower (model.encode_text(tokens) in open_clip, "
                "model.get_text_features(**tokenizer(prompts)) in transformers)."
            )
        self.model = model
        self.encode = _image_encoder(model)
        self.register_buffer("text", F.normalize(text_embeddings.detach().float(), dim=-1))
        learned = getattr(model, "logit_scale", None)
        if scale is None:
            scale = float(learned.detach().exp()) if isinstance(learned, Tensor) else 100.0
        self.scale = check_number("scale", scale, 0.0, low_open=True)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) images -> (B, K) logits."""
        image = self.encode(x)
        if image.shape[-1] != self.text.shape[-1]:
            raise ValueError(
                f"The image embeddings have {image.shape[-1]} dimensions, the text embeddings "
                f"{self.text.shape[-1]}: encode the prompts with the same model."
            )
        similarity = F.normalize(image.float(), dim=-1) @ self.text.to(image.device).T
        return self.scale * similarity


def _image_encoder(model: nn.Module) -> Callable[[Tensor], Tensor]:
    if callable(getattr(model, "encode_image", None)):  # open_clip
        return model.encode_image
    if callable(getattr(model, "get_image_features", None)):  # transformers

        def features(x: Tensor) -> Tensor:
            return embedding_of(model.get_image_features(pixel_values=x))

        return features
    raise TypeError(
        f"{type(model).__name__} has no image encoder vizkit knows (open_clip's encode_image, "
        "transformers' get_image_features)."
    )


def zero_shot(model: nn.Module, text_embeddings: Tensor, scale: float | None = None) -> nn.Module:
    """`ZeroShotClassifier` in eval mode: ``vk.gradcam(vk.models.zero_shot(clip, text), x,
    target=k)`` explains each image by its similarity to prompt k."""
    return ZeroShotClassifier(model, text_embeddings, scale).eval()


class ImageTower(nn.Module):
    """A CLIP-family model's image tower alone: (B, C, H, W) images -> (B, D) image embeddings
    in the joint image-text space, for `vizkit.targets.text` (a transformers ``CLIPModel``'s
    forward needs text too). The tower keeps its family's names (under ``model.``).
    ``num_classes`` is 0 as on a timm backbone: it returns embeddings, not class logits."""

    num_classes = 0

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.encode = _image_encoder(model)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) images -> (B, D) image embeddings."""
        return self.encode(x)


def _tower_layout(tower: ImageTower) -> FamilyLayout | None:
    """The layout of the vision tower inside, read out through what the embedding adds after
    its pooled output (transformers' ``visual_projection``; open_clip's tower projects
    inside)."""
    projection = getattr(tower.model, "visual_projection", None)
    return projected(inner_layout(tower), projection if isinstance(projection, nn.Linear) else None)


register_family(Family("image_tower", "vizkit", models={ImageTower: _tower_layout}))


def image_tower(model: nn.Module) -> nn.Module:
    """`ImageTower` of ``model``, in the mode ``model`` is in (no module of it is switched:
    every analysis runs in eval mode for its call and restores each module's mode after):
    ``vk.gradcam(vk.models.image_tower(clip), x, target=vk.targets.text(clip, "a photo of a
    dog", tokenizer=tok))``."""
    tower = ImageTower(model)
    tower.training = model.training  # the wrapper alone: ``.train()`` would set every module
    return tower


def zero_shot_predictions(embeddings: Tensor, text_embeddings: Tensor) -> Tensor:
    """(n,) the index of the nearest of the K ``text_embeddings`` (K, D) to each embedding
    (cosine; Radford et al. 2021, Sec. 3.1.2)."""
    similarity = (
        F.normalize(embeddings.float(), dim=-1)
        @ F.normalize(text_embeddings.float().to(embeddings.device), dim=-1).T
    )
    return similarity.argmax(-1)
