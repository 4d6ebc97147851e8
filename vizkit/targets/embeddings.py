"""Targets of a backbone's embedding: what a map explains on a model without class logits. Backbones
(DINOv2, CLIP and SigLIP image towers, timm models with ``num_classes=0``) return embeddings, so
a class index means nothing there. Each helper here is a `ScoreTarget`: ``target=`` of every
method, metric and `compare_saliency` takes it, and it reads the embedding from the model's own
output type (a tensor, a transformers ``ModelOutput``, an open_clip tuple or dict).

>>> import torch, vizkit as vk
>>> vk.targets.embedding_norm()(torch.tensor([[3.0, 4.0]]))
tensor([5.])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hooks.contract import held
from ..hooks.inputs import check_count, check_images, model_device, unwrap_model
from ..hooks.scores import ScoreTarget, class_indices

__all__ = [
    "EMBEDDING_KEYS",
    "Direction",
    "EmbeddingNorm",
    "Probe",
    "SimilarTo",
    "direction",
    "embed",
    "embedding_of",
    "encode_texts",
    "embedding_norm",
    "pca_component",
    "probe",
    "prototypes",
    "region",
    "similar_to",
    "similar_to_region",
    "text",
]

# where a structured output keeps its image embedding, in the order they are looked for:
# transformers' projected embedding (CLIPVisionModelWithProjection), open_clip's dict, the
# pooled output of a transformers backbone (Dinov2Model, CLIPVisionModel, SiglipVisionModel)
EMBEDDING_KEYS = ("image_embeds", "image_features", "pooler_output")


def embedding_of(output: object) -> Tensor:
    """(B, D) the image embedding in a model's raw output: a (B, D) tensor itself, the first of
    `EMBEDDING_KEYS` a ``ModelOutput`` or dict holds, or the first element of an open_clip
    tuple ``(image_features, text_features, logit_scale)``."""
    found = output
    if isinstance(output, dict):
        found = next((output[k] for k in EMBEDDING_KEYS if output.get(k) is not None), None)
        if found is None:
            raise TypeError(
                f"The model's {type(output).__name__} holds no image embedding (looked for "
                f"{', '.join(EMBEDDING_KEYS)}; it has {', '.join(output.keys())}). Pass a "
                "callable target on the output instead, e.g. "
                f"target=lambda out: out.{next(iter(output.keys()), 'key')}[:, 0, 0]."
            )
    elif isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        found = output[0]
    if not isinstance(found, Tensor) or found.ndim != 2:
        shape = tuple(found.shape) if isinstance(found, Tensor) else type(found).__name__
        raise ValueError(
            f"An embedding target needs (B, D) image embeddings; the model gave {shape}. A "
            "model returning tokens (B, N, D) must be pooled first: wrap it so that it returns "
            "the pooled embedding, or pass a callable target on its output."
        )
    return found


def _per_row(values: Tensor, rows: Tensor | int | None, count: int, what: str) -> Tensor:
    """``values`` (D,) or (B, ...) for ``count`` rows: the same for every row, or row
    ``rows[i]`` (an int: that row for all; None: row i, where count is B)."""
    if values.ndim == 1:
        return values.expand(count, -1)
    if rows is None and count != len(values):
        raise ValueError(
            f"{what} has {len(values)} rows, one per image, and the output {count}, so which "
            "row is of which image is unknown here: give a single one for every image."
        )
    rows = torch.arange(count) if rows is None else torch.as_tensor(rows).expand(count)
    if int(rows.max()) >= len(values):
        raise ValueError(
            f"{what} has {len(values)} rows, one per image, but the batch has image "
            f"{int(rows.max())}: give one per image of the batch, or a single one for all."
        )
    return values[rows.to(values.device)]


class EmbeddingNorm(ScoreTarget):
    """The L2 norm of the image embedding: what makes the embedding large (B,)."""

    label = "embedding norm"

    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        return embedding_of(output).float().norm(dim=-1)


class SimilarTo(ScoreTarget):
    """Cosine similarity of the image embedding to a reference embedding: what makes the image
    alike the reference (another image's embedding, a class prototype, a text embedding).

    Args:
        reference: (D,) or (1, D) one reference for every image, or (B, D) one per image of
            the batch.
        versus: the same for a contrast: the score is cos(e, reference) - cos(e, versus).
        label: the name results and figures give it.
    """

    def __init__(self, reference: Tensor, versus: Tensor | None = None, label: str = "similarity"):
        self.reference = _one_for_all(_check_embeddings("reference", reference))
        self.versus = None if versus is None else _one_for_all(_check_embeddings("versus", versus))
        self.label = label
        self.per_image = self.reference.ndim == 2 or (
            self.versus is not None and self.versus.ndim == 2
        )

    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        image = F.normalize(embedding_of(output).float(), dim=-1)
        score = self._cosine(image, self.reference, rows, "reference")
        if self.versus is not None:
            score = score - self._cosine(image, self.versus, rows, "versus")
        return score

    @staticmethod
    def _cosine(image: Tensor, reference: Tensor, rows: Tensor | int | None, what: str) -> Tensor:
        if reference.shape[-1] != image.shape[-1]:
            raise ValueError(
                f"The {what} embedding has {reference.shape[-1]} dimensions, the model's image "
                f"embedding {image.shape[-1]}: compute it with the same model "
                "(vk.targets.embed(model, images))."
            )
        chosen = _per_row(reference.to(image.device), rows, len(image), f"The {what}")
        return (image * F.normalize(chosen, dim=-1)).sum(-1)


class Direction(ScoreTarget):
    """The embedding's coordinate along a direction: ``(e - center) . v`` (B,), e.g. a
    principal component of a set of embeddings (`pca_component`)."""

    def __init__(self, vector: Tensor, center: Tensor | None = None, label: str = "direction"):
        self.vector = _check_embeddings("vector", vector, rows=False)
        self.center = torch.zeros_like(self.vector) if center is None else center.float()
        self.label = label

    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        image = embedding_of(output).float()
        if image.shape[-1] != len(self.vector):
            raise ValueError(
                f"The direction has {len(self.vector)} dimensions, the model's image embedding "
                f"{image.shape[-1]}: compute it from this model's embeddings."
            )
        return (image - self.center.to(image.device)) @ self.vector.to(image.device)


class Probe(ScoreTarget):
    """The logit of a class under a linear probe on the embedding, ``e W^T + b`` (the class
    prototypes' cosine similarity with ``normalize=True``).

    Args:
        weight: (K, D) one row per class.
        bias: (K,) or None.
        classes: the class each image's score is of: an int, or B ints.
        normalize: compare unit vectors (prototypes: cosine similarity), not raw logits.
    """

    def __init__(
        self, weight: Tensor, bias: Tensor | None, classes: int | Sequence[int] | Tensor,
        normalize: bool = False, label: str = "probe",
    ) -> None:  # fmt: skip
        self.weight = _check_embeddings("weight", weight)
        if self.weight.ndim != 2:
            raise ValueError(
                f"weight must be (K, D), one row per class; got {tuple(weight.shape)}."
            )
        if bias is not None and (not isinstance(bias, Tensor) or bias.shape != weight.shape[:1]):
            got = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
            raise ValueError(f"bias must be ({len(weight)},), one per class, or None; got {got}.")
        self.bias = None if bias is None else bias.detach().float()
        count = len(classes) if isinstance(classes, (Sequence, Tensor)) and _rows(classes) else 1
        self.classes = class_indices(classes, count)
        bad = self.classes[(self.classes < 0) | (self.classes >= len(self.weight))]
        if bad.numel():
            raise ValueError(
                f"Class {int(bad[0])} is out of range: the probe has {len(self.weight)} classes "
                f"(valid: 0..{len(self.weight) - 1})."
            )
        self.normalize = normalize
        self.label = label
        self.per_image = len(self.classes) > 1

    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        image = embedding_of(output).float()
        if image.shape[-1] != self.weight.shape[-1]:
            raise ValueError(
                f"The probe takes {self.weight.shape[-1]}-dimensional embeddings, the model "
                f"gives {image.shape[-1]}: train it on this model's embeddings."
            )
        weight = self.weight.to(image.device)
        if self.normalize:
            image, weight = F.normalize(image, dim=-1), F.normalize(weight, dim=-1)
        logits = image @ weight.T
        if self.bias is not None:
            logits = logits + self.bias.to(image.device)
        if len(self.classes) == 1:
            classes = self.classes.expand(len(image))
        else:
            classes = _per_row(self.classes[:, None], rows, len(image), "classes")[:, 0]
        return logits.gather(1, classes[:, None].to(image.device))[:, 0]


def _rows(classes: Sequence | Tensor) -> bool:
    """Whether ``classes`` holds one class per image (not a 0-d tensor)."""
    return not isinstance(classes, Tensor) or classes.ndim > 0


def _one_for_all(embeddings: Tensor) -> Tensor:
    """A (1, D) reference (`embed` of one image) as (D,): one for every image."""
    return embeddings[0] if embeddings.ndim == 2 and len(embeddings) == 1 else embeddings


def _check_embeddings(name: str, value: object, rows: bool = True) -> Tensor:
    """``value`` detached as float: (D,) or, with ``rows``, (B, D); finite."""
    dims = (1, 2) if rows else (1,)
    if not isinstance(value, Tensor) or value.ndim not in dims or not value.is_floating_point():
        got = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, Tensor) else repr(value)
        want = "(D,) or (B, D)" if rows else "(D,)"
        raise ValueError(
            f"{name} must be a floating {want} tensor of embeddings; got {got}. Compute "
            "embeddings with vk.targets.embed(model, images)."
        )
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} holds NaN or Inf.")
    return value.detach().float()


def embedding_norm() -> EmbeddingNorm:
    """Explain what makes each image's embedding large (its L2 norm)."""
    return EmbeddingNorm()


def similar_to(reference: Tensor, versus: Tensor | None = None) -> SimilarTo:
    """Explain what makes each image alike ``reference`` (D,) or (B, D), e.g.
    ``vk.targets.similar_to(vk.targets.embed(model, other_images))``; ``versus``: a contrast."""
    return SimilarTo(reference, versus, "similarity")


def similar_to_region(
    model: nn.Module, images: Tensor, box: tuple[int, int, int, int]
) -> SimilarTo:
    """Explain what makes each image alike a region of itself: the cosine similarity of the
    image's embedding to the embedding of its crop ``box`` (`region`), e.g. which parts of the
    photo make it look like the dog in its corner. One reference per image, so pass the same
    ``images`` the maps are computed for."""
    return SimilarTo(region(model, images, box), label=f"similarity to region {tuple(box)}")


def direction(vector: Tensor, center: Tensor | None = None) -> Direction:
    """Explain the embedding's coordinate along ``vector`` (D,), measured from ``center``."""
    return Direction(vector, center)


def pca_component(embeddings: Tensor, k: int = 0) -> Direction:
    """Explain the ``k``-th principal component of ``embeddings`` (M, D) (e.g. of a data set,
    `embed`): each image's coordinate along it, from their mean. The sign is fixed so that the
    component's largest entry is positive (scikit-learn's convention)."""
    embeddings = _check_embeddings("embeddings", embeddings)
    k = check_count("k", k, 0, min(embeddings.shape) - 1)
    if embeddings.ndim != 2 or len(embeddings) < 2:
        raise ValueError(
            "pca_component needs (M, D) embeddings of M >= 2 images; got "
            f"{tuple(embeddings.shape)}."
        )
    center = embeddings.mean(0)
    _, _, vh = torch.linalg.svd(embeddings - center, full_matrices=False)
    component = vh[k]
    component = component * component[component.abs().argmax()].sign()
    return Direction(component, center, f"PCA component {k}")


def probe(weight: Tensor, bias: Tensor | None, classes: int | Sequence[int] | Tensor) -> Probe:
    """Explain class ``classes`` (an int, or B ints) of a linear probe ``e W^T + b`` trained on
    the embeddings (``weight`` (K, D), ``bias`` (K,) or None)."""
    return Probe(weight, bias, classes, normalize=False, label="probe")


def prototypes(prototypes: Tensor, classes: int | Sequence[int] | Tensor) -> Probe:
    """Explain each image's cosine similarity to class prototype ``classes`` (an int or B ints)
    of ``prototypes`` (K, D) (e.g. the mean embedding of each class's images)."""
    return Probe(prototypes, None, classes, normalize=True, label="prototype")


def embed(model: nn.Module, images: Tensor, batch_size: int = 64) -> Tensor:
    """(B, D) the model's image embeddings of ``images`` (B, C, H, W), in eval mode, without
    gradients, ``batch_size`` images per forward (as `embedding_of` reads its output)."""
    model = unwrap_model(model.model if hasattr(model, "hook_names") else model)
    images = check_images(model, images)
    batch_size = check_count("batch_size", batch_size)
    with held(model), torch.no_grad():
        parts = [embedding_of(model(chunk)).float() for chunk in images.split(batch_size)]
    return torch.cat(parts)


def region(
    model: nn.Module, images: Tensor, box: tuple[int, int, int, int], batch_size: int = 64
) -> Tensor:
    """(B, D) the embeddings of the crop ``box`` = (top, left, height, width), in pixels, of
    each of ``images`` (B, C, H, W), resized back to (H, W) (bilinear, antialiased): a local
    view of the image, the kind DINO's multi-crop training teaches the model to match with the
    whole image (Caron et al. 2021, "Emerging Properties in Self-Supervised Vision
    Transformers", Sec. 3.1)."""
    images = check_images(
        unwrap_model(model.model if hasattr(model, "hook_names") else model), images
    )
    height, width = images.shape[-2:]
    top, left, rows, cols = _check_box(box, height, width)
    crops = images[..., top : top + rows, left : left + cols]
    resized = F.interpolate(crops, size=(height, width), mode="bilinear", antialias=True)
    return embed(model, resized, batch_size)


def _check_box(box: object, height: int, width: int) -> tuple[int, int, int, int]:
    """``box`` as (top, left, height, width) ints inside an image of ``height`` x ``width``."""
    values = tuple(box) if isinstance(box, Sequence) else ()
    if (len(values) != 4 or not all(isinstance(v, int) and not isinstance(v, bool)
                                    for v in values)):  # fmt: skip
        raise ValueError(f"box must be 4 ints (top, left, height, width) in pixels; got {box!r}.")
    top, left, rows, cols = values
    if min(top, left) < 0 or min(rows, cols) < 1 or top + rows > height or left + cols > width:
        raise ValueError(
            f"box {values} (top, left, height, width) must lie inside the {height} x {width} "
            "image and be at least one pixel high and wide."
        )
    return values


def text(
    model: nn.Module, prompts: str | Sequence[str], tokenizer=None,
    versus: str | Sequence[str] | None = None,
) -> SimilarTo:  # fmt: skip
    """Explain each image's similarity to a text prompt in a CLIP-family model's joint space
    (Radford et al. 2021, Sec. 3.1.2); several prompts are averaged into one embedding (prompt
    ensembling, Sec. 3.1.4); ``versus``: prompts to contrast with (the score is the difference
    of the two cosines).

    The explained model must return image embeddings in the same space: an open_clip CLIP
    itself, a transformers ``CLIPVisionModelWithProjection`` / ``SiglipVisionModel``, or
    `vizkit.models.image_tower` of a ``CLIPModel`` / ``SiglipModel``.

    Args:
        model: the CLIP-family model whose text tower encodes the prompts (open_clip's
            ``encode_text``, transformers' ``get_text_features``).
        prompts: a prompt, or prompts to average.
        tokenizer: open_clip's ``get_tokenizer(name)`` (default: open_clip's CLIP tokenizer at
            the model's context length), or the transformers tokenizer of the checkpoint.
        versus: a contrast prompt or prompts.
    """
    reference = text_embedding(model, prompts, tokenizer)
    other = None if versus is None else text_embedding(model, versus, tokenizer)
    label = _prompt_label(prompts) + ("" if versus is None else f" vs {_prompt_label(versus)}")
    return SimilarTo(reference, other, label)


def _prompt_label(prompts: str | Sequence[str]) -> str:
    return repr(prompts) if isinstance(prompts, str) else " | ".join(map(repr, prompts))


def text_embedding(model: nn.Module, prompts: str | Sequence[str], tokenizer=None) -> Tensor:
    """(D,) the unit-normalized mean of the prompts' normalized text embeddings."""
    return F.normalize(encode_texts(model, prompts, tokenizer).mean(0), dim=0)


def encode_texts(
    model: nn.Module, prompts: str | Sequence[str], tokenizer=None, batch_size: int = 256
) -> Tensor:
    """(M, D) the normalized text embeddings of ``prompts`` by a CLIP-family ``model``'s text
    tower, ``batch_size`` prompts per forward (``tokenizer`` as `text` takes it)."""
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError(f"prompts must be a non-empty string or strings; got {prompts!r}.")
    batch_size = check_count("batch_size", batch_size)
    model = unwrap_model(model)
    encode = _text_encoder(model, tokenizer)
    with held(model), torch.no_grad():
        embeddings = [encode(prompts[i : i + batch_size])
                      for i in range(0, len(prompts), batch_size)]  # fmt: skip
    return F.normalize(torch.cat(embeddings).float(), dim=-1)


def _text_encoder(model: nn.Module, tokenizer) -> Callable[[list[str]], Tensor]:
    if callable(getattr(model, "encode_text", None)):  # open_clip
        if tokenizer is None:  # open_clip's CLIP tokenizer, at the model's context length
            from open_clip.tokenizer import SimpleTokenizer

            tokenizer = SimpleTokenizer(context_length=getattr(model, "context_length", 77))
        return lambda texts: model.encode_text(tokenizer(texts).to(model_device(model)))
    if callable(getattr(model, "get_text_features", None)):  # transformers
        if tokenizer is None:
            raise ValueError(
                f"{type(model).__name__} needs its checkpoint's tokenizer: "
                "vk.targets.text(model, prompts, tokenizer=AutoTokenizer.from_pretrained("
                "checkpoint))."
            )

        def features(texts: list[str]) -> Tensor:
            tokens = tokenizer(texts, padding="max_length", truncation=True, return_tensors="pt")
            tokens = {k: v.to(model_device(model)) for k, v in tokens.items()}
            return embedding_of(model.get_text_features(**tokens))

        return features
    raise TypeError(
        f"{type(model).__name__} has no text tower vizkit knows (open_clip's encode_text, "
        "transformers' get_text_features): text targets need a CLIP-family model. Use "
        "vk.targets.similar_to(embedding) with an embedding of your own instead."
    )
