"""How a target becomes a score: which logit (or callable score) to differentiate or read.

A target is a class index (or B of them) on a model with class logits, or a score on the model's
raw output: a callable, or a `ScoreTarget` (the ``vizkit.targets`` helpers for backbones, which
return embeddings, not logits), whose score may depend on the image a row of the output is of.
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "ScoreTarget",
    "Target",
    "call_target",
    "class_indices",
    "explained_classes",
    "is_backbone",
    "is_score_target",
    "model_logits",
    "output_rows",
    "refuse_dense",
    "require_class_logits",
    "require_classifier",
    "select_images",
    "target_indices",
    "target_label",
    "target_score",
]


class ScoreTarget(ABC):
    """A score per image on a model's raw output, whatever its type (`vizkit.targets`).

    ``target(output, rows)`` gives (n,) scores for the n rows of ``output``; ``rows`` says
    which image of the explained batch each row is of: (n,) indices, an int for rows that are
    all copies of one image, or None for row i is image i. So a score that differs by image (a
    reference embedding per image, a probe class per image) follows perturbed copies.
    ``label`` names it in results and figures.
    """

    label = "score"
    per_image = False  # whether the score holds a value per image of the batch

    @abstractmethod
    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        """(n,) scores of the n rows of ``output``."""

    def __repr__(self) -> str:
        return f"<target: {self.label}>"


Target = int | Sequence[int] | Tensor | Callable[[Tensor], Tensor] | ScoreTarget | None


class _Selected(ScoreTarget):
    """``target`` on the images ``images`` (m,) of its batch, as a batch of their own."""

    def __init__(self, target: ScoreTarget, images: Tensor):
        self.target, self.images, self.label = target, images.cpu(), target.label
        self.per_image = target.per_image

    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        mapped = self.images if rows is None else self.images[torch.as_tensor(rows).cpu()]
        return self.target(output, mapped)


def select_images(target: Target, images: Tensor) -> Target:
    """``target`` for the images ``images`` (m,) (indices into its batch) taken as a batch of
    their own: a `ScoreTarget` maps rows back to its images; other targets are returned as
    they are (a plain callable scores each row by itself)."""
    return _Selected(target, images) if isinstance(target, ScoreTarget) else target


def target_label(target: object) -> object:
    """``target`` as results record it: a score target by its label (a callable by its
    name), anything else as it is."""
    if not is_score_target(target):
        return target
    return getattr(target, "label", None) or getattr(target, "__name__", "callable")


def is_score_target(target: object) -> bool:
    """Whether ``target`` scores the model's output itself (a callable or a `ScoreTarget`)
    instead of naming class indices."""
    return callable(target) and not isinstance(target, Tensor)


def call_target(
    target: Callable, output: object, rows: Tensor | int | None = None, count: int | None = None
) -> Tensor:
    """(n,) the score ``target`` gives the n rows of ``output``; ``rows``: the image of the
    batch each row is of, (n,) or one int for all (a `ScoreTarget` reads it; a plain callable
    scores each row by itself); ``count``: the number of rows, where ``rows`` does not give it.
    A callable's (n, ...) values are summed per row, as `target_score` sums them for the
    gradient methods; a score that is not a tensor with one row per image is refused."""
    score = target(output, rows) if isinstance(target, ScoreTarget) else target(output)
    if not isinstance(score, Tensor):
        raise TypeError(f"A callable target must return a tensor; got {type(score).__name__}.")
    count = len(rows) if isinstance(rows, Tensor) else count
    if score.ndim == 0 or (count is not None and len(score) != count):
        raise ValueError(
            "A callable target must give a score per image, shape (B,) (or (B, ...), summed per "
            f"image); got {tuple(score.shape)}"
            + ("" if count is None else f" for {count} images")
            + ". Keep the batch axis, e.g. target=lambda out: out[:, 0] on (B, D) embeddings "
            "(not out[0] or out.sum()), or use a vizkit.targets helper."
        )
    return score.flatten(1).sum(1) if score.ndim > 1 else score


def output_rows(output: object) -> int | None:
    """The rows of a model output: the leading size of its logits or first tensor (a
    ``ModelOutput``, dict, tuple or tensor); None where it has none."""
    found = model_logits(output)
    if isinstance(found, dict):
        found = next((v for v in found.values() if isinstance(v, Tensor)), None)
    elif isinstance(found, (tuple, list)):
        found = next((v for v in found if isinstance(v, Tensor)), None)
    return len(found) if isinstance(found, Tensor) and found.ndim else None


def target_score(output: Tensor, target: Target, batch: int) -> Tensor:
    """The scalar whose gradient is taken: the sum over the batch of each sample's target logit.

    Args:
        output: model output, (B, K) logits for int targets.
        target: a class index for every sample; a list/tensor of B class indices (one per
            sample); a callable ``output -> Tensor`` giving (B,) or (B, ...) scores (summed);
            None: each sample's argmax.
        batch: B, the number of images explained (a callable's score without that batch axis,
            such as ``out[0]``, would explain one image as all of them: refused).

    Returns:
        A scalar tensor.
    """
    if is_score_target(target):
        score = call_target(target, output, None, batch)
    else:
        logits = model_logits(output)
        index = target_indices(logits, target)  # checks that output is (B, K) logits
        score = logits.gather(1, index[:, None])
    if not bool(torch.isfinite(score).all()):
        raise ValueError(
            "The target score is NaN or Inf, so its gradient means nothing: the model's output "
            "(or the callable target) is not finite on this batch. Check the weights and the "
            "input's normalization (float16 overflow?)."
        )
    return score.sum()


def model_logits(output: object) -> object:
    """The logits of a model output: the output itself, or the ``logits`` of a structured one
    (a transformers ``ModelOutput``, a dict); other outputs are returned as they are."""
    logits = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
    return logits if isinstance(logits, Tensor) else output


def explained_classes(output: Tensor, target: Target) -> Tensor | None:
    """(B,) class index each sample's score refers to; None for a callable target."""
    if is_score_target(target):
        return None
    return target_indices(model_logits(output), target)


def target_indices(output: Tensor, target: Target) -> Tensor:
    """(B,) class indices for ``target`` (an int, B ints, or None for the argmax), validated
    against the (B, K) logits ``output``."""
    if isinstance(output, Tensor) and output.ndim == 4:
        raise ValueError(
            f"Class-index targets need (B, num_classes) logits; the model returned "
            f"{tuple(output.shape)}, a map per image (per-pixel logits?). {DENSE_FIX}"
        )
    if not isinstance(output, Tensor) or output.ndim != 2:
        shape = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise ValueError(
            f"Class-index targets need (B, num_classes) logits; the model returned {shape} (a "
            "backbone's embeddings?). Choose what to explain with target=, e.g. "
            "target=vk.targets.embedding_norm() or vk.targets.similar_to(reference): they "
            "read the embedding from tensors, transformers ModelOutputs and open_clip tuples "
            "(vizkit.targets lists them all)."
        )
    if is_score_target(target):
        raise ValueError(
            "This analysis scores a class (its logit or probability), so it needs class "
            "indices, not a score on the output (a callable or a vizkit.targets helper). The "
            "saliency methods, deletion, insertion, compare_saliency and evaluate's curve "
            "metrics take score targets."
        )
    batch, classes = output.shape
    if target is None:
        return output.argmax(dim=-1)
    index = class_indices(target, batch).to(output.device)
    bad = index[(index < 0) | (index >= classes)]
    if bad.numel():
        raise ValueError(
            f"Target class {bad[0].item()} is out of range: the model has "
            f"{classes} classes (valid: 0..{classes - 1})."
        )
    return index


def class_indices(target: Target, batch: int) -> Tensor:
    """(B,) int64 class indices from an int (numpy integers too) for every sample, or B of them
    (a list, tuple, integer tensor or array). Float, bool and str targets are refused: a class
    index is never rounded."""
    valid = "an int class index, B of them (list, tuple, integer tensor or array), a callable on "
    valid += "the output, or None for each sample's argmax"
    if isinstance(target, np.ndarray) or isinstance(target, np.generic):
        target = torch.from_numpy(np.asarray(target))
    if isinstance(target, Tensor):
        if target.ndim == 2 and target.shape[-1] > 1:
            raise ValueError(
                f"target must be {valid}; got a {tuple(target.shape)} tensor, one row of "
                "scores per sample (one-hot labels or probabilities?). Pass the class "
                "indices: target.argmax(dim=1)."
            )
        if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
            raise TypeError(
                f"target must be {valid}; got a {target.dtype} tensor. Class indices are "
                "integers: pass target.long() if the values are whole numbers."
            )
        index = target.reshape(-1).long()
    elif isinstance(target, numbers.Integral) and not isinstance(target, bool):
        index = torch.tensor([int(target)])
    elif isinstance(target, Sequence) and not isinstance(target, str):
        wrong = [t for t in target if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
        if wrong:
            raise TypeError(f"target must be {valid}; got {wrong[0]!r} in {list(target)!r}.")
        index = torch.tensor([int(t) for t in target], dtype=torch.long)
    else:
        raise TypeError(f"target must be {valid}; got {target!r} ({type(target).__name__}).")
    if index.numel() == 1:
        return index.expand(batch)
    if index.numel() != batch:
        raise ValueError(
            f"Got {index.numel()} targets for a batch of {batch}; give one int "
            "for all samples or one per sample."
        )
    return index


# transformers heads whose output is a map per image, not class logits
_MASK_MODELS = ("SamModel", "Sam2Model")  # promptable: masks per prompt
_DENSE_HEADS = ("ForSemanticSegmentation", "ForDepthEstimation", "ForUniversalSegmentation",
                "ForInstanceSegmentation", "ForMaskGeneration")  # fmt: skip

DENSE_FIX = (
    "Choose what to explain with target=: vk.targets.segment(class, mask) (a class's logits "
    "summed over a mask; vk.targets.box_mask(box, size) makes one of a box), "
    "vk.targets.segment(class) (over the pixels the class wins), vk.targets.pixel(class, y, x), "
    "vk.targets.depth_region(mask) or vk.targets.depth_difference(near, far) for a depth model, "
    "vk.targets.mask_logit(mask, region) for a promptable mask model (SAM 2: give it its prompt "
    "with vk.models.prompted_masks(model, points=...))."
)


def is_dense(model: nn.Module) -> bool:
    """Whether ``model`` returns a map per image (segmentation logits, depth, masks): a
    transformers model with a dense head, SAM / SAM 2, or a module that says so
    (``dense_output = True``: `vizkit.models.PromptedMasks`)."""
    name = type(model).__name__
    transformers = type(model).__module__.startswith("transformers.")
    return (
        getattr(model, "dense_output", False) is True
        or transformers
        and (any(head in name for head in _DENSE_HEADS) or name in _MASK_MODELS)
    )


def refuse_dense(model: nn.Module, what: str) -> None:
    """Refuse a dense model (`is_dense`) for ``what`` reads its output as class logits or an
    embedding, which a map per image is not."""
    if is_dense(model):
        raise ValueError(
            f"{type(model).__name__} returns a map per image (per-pixel logits or depth), and "
            f"{what} reads class probabilities or an embedding, which it has none of; this is "
            "not defined for dense outputs yet. The saliency methods explain them with a "
            f"target: {DENSE_FIX}"
        )


def is_backbone(model: nn.Module) -> bool:
    """Whether ``model`` returns image embeddings instead of class logits: a transformers model
    without an image- or video-classification head, an open_clip CLIP, a timm model with
    ``num_classes=0`` (or a model of vizkit's that says so), a torchvision model whose head
    was replaced by ``nn.Identity``."""
    if type(model).__module__.startswith("transformers."):
        name = type(model).__name__
        heads = ("ForImageClassification", "ForVideoClassification", *_DENSE_HEADS)
        return not any(head in name for head in heads)
    if all(callable(getattr(model, f, None)) for f in ("encode_image", "encode_text")):
        return True  # open_clip: (image_features, text_features, logit_scale)
    return getattr(model, "num_classes", None) == 0 or any(
        isinstance(getattr(model, head, None), nn.Identity) for head in ("head", "heads", "fc")
    )


def require_classifier(model: nn.Module, why: str) -> None:
    """Refuse a backbone for a view that reads class logits through the classifier head
    (``why`` says how), naming the views that score an embedding target instead."""
    if is_dense(model):
        raise ValueError(
            f"{type(model).__name__} returns a map per image, not class logits, and {why}, "
            "which it has none of. The saliency methods explain a dense output with a target: "
            f"{DENSE_FIX}"
        )
    if is_backbone(model):
        raise ValueError(
            f"{type(model).__name__} is a backbone: it returns image embeddings, not class "
            f"logits, and {why}, which it has none of. On a backbone, score an embedding "
            "target with the views that take one: vk.ablation(model, x, "
            "target=vk.targets.embedding_norm()) or vk.activation_patching(model, x, "
            "corrupted, target=vk.targets.embedding_norm()) (or another vk.targets helper)."
        )


def require_class_logits(model: nn.Module, target: Target, param: str = "target") -> None:
    """Refuse class-index targets (and the argmax, ``None``) on a backbone: its output is an
    embedding, whose largest dimension is no class. The message names the embedding targets
    and a fix that runs on that model's output type."""
    if is_score_target(target):
        return
    what = "the argmax" if target is None else f"class index {target!r}"
    if is_dense(model):
        raise ValueError(
            f"{type(model).__name__} returns a map per image (per-pixel logits or depth), not "
            f"class logits, so {what} names no score. {DENSE_FIX}"
        )
    if not is_backbone(model):
        return
    if param != "target":
        what = f"{param}={target!r}" if target is not None else f"class {param}"
    raise ValueError(
        f"{type(model).__name__} is a backbone: it returns image embeddings, not class logits, "
        f"so {what} would explain an embedding dimension as if it were a class. Choose what to "
        f"explain with {param}=: vk.targets.embedding_norm() (the embedding's norm), "
        "vk.targets.similar_to(vk.targets.embed(model, reference_images)) (what makes the "
        "images alike), vk.targets.pca_component(vk.targets.embed(model, images)), "
        "vk.targets.probe(weight, bias, classes) or vk.targets.prototypes(prototypes, classes), "
        "vk.targets.text(clip, 'a photo of a dog') for CLIP-family models (or "
        "vk.models.zero_shot for prompts as classes), or a callable on the output, e.g. "
        "target=lambda out: vk.targets.embedding_of(out)[:, 0]. For example: "
        f"{param}=vk.targets.embedding_norm()."
    )
