"""Is a prediction worth explaining? Scores of a prediction near chance measure noise.

Deletion and insertion track the probability of the class explained; when the model's softmax is
near-uniform (a random-init model gives every one of 1000 classes about 0.001) or the class's
probability is tiny, every curve starts and stays near zero and the AUCs of all methods differ by
noise. `near_chance` is the test `compare_saliency` (and its table, figures and the report) use
to say so instead of ranking that noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..analysis.result import Result
from ..hooks.inputs import check_number
from ..hooks.scores import Target, target_indices

__all__ = [
    "NEAR_UNIFORM",
    "TINY_PROBABILITY",
    "Predictions",
    "certainty",
    "near_chance",
    "prediction_certainty",
    "predictions",
]

NEAR_UNIFORM = 0.9  # normalized entropy at or above which a softmax counts as near-uniform
TINY_PROBABILITY = 0.01  # probability of the class explained below which it counts as tiny


def prediction_certainty(logits: Tensor, target: Target = None) -> tuple[Tensor, Tensor]:
    """How far from chance each prediction is: the softmax's entropy over its maximum log K
    (1: uniform, 0: one class), and the probability of ``target``. Both (B,) float32.

    Args:
        logits: (B, K) model outputs.
        target: the class of each image: an int, B ints, or None for the argmax.
    """
    targets = target_indices(logits, target)
    p = logits.detach().float().softmax(-1)
    classes = p.shape[-1]
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
    normalized = entropy / math.log(classes) if classes > 1 else torch.ones_like(entropy)
    return normalized.clamp(0, 1), p.gather(1, targets[:, None])[:, 0]


def near_chance(
    logits: Tensor,
    target: Target = None,
    entropy: float = NEAR_UNIFORM,
    probability: float = TINY_PROBABILITY,
) -> Tensor:
    """(B,) bool: True where a prediction is too close to chance for its explanation's scores to
    mean anything: its softmax is near-uniform (normalized entropy >= ``entropy``, see
    `prediction_certainty`) or the probability of ``target`` is below ``probability``.

    Args:
        logits: (B, K) model outputs.
        target: the class explained: an int, B ints, or None for the argmax.
        entropy: in (0, 1]; the default 0.9 flags random-init timm models (0.97 to 1.0 on
            ImageNet's 1000 classes) and no image of the trained Shapes models (at most 0.65).
        probability: in [0, 1); the default 0.01 flags a class the model all but rules out.

    >>> near_chance(torch.tensor([[0.1, 0.0, 0.05], [5.0, 0.0, 0.0]])).tolist()
    [True, False]
    """
    entropy = check_number("entropy", entropy, 0, 1, low_open=True)
    probability = check_number("probability", probability, 0, 1, high_open=True)
    normalized, chosen = prediction_certainty(logits, target)
    return (normalized >= entropy) | (chosen < probability)


def certainty(logits: Tensor, target: Target = None) -> dict[str, Tensor]:
    """What a table records of each prediction (on the CPU): ``near_chance`` (B,) bool
    (`near_chance` at its defaults), ``target_probability`` and ``prediction_entropy`` (B,)
    (`prediction_certainty`) for logits (B, K) and the class explained."""
    entropy, probability = prediction_certainty(logits, target)
    return {
        "near_chance": near_chance(logits, target).cpu(),
        "target_probability": probability.cpu(),
        "prediction_entropy": entropy.cpu(),
    }


@dataclass(repr=False)
class Predictions(Result):
    """What a model predicts for B images, and whether each prediction is near chance.

    Attributes:
        probabilities: (B, K) softmax outputs.
        near_chance: (B,) bool (`near_chance` of the top class, at its defaults).
        entropy: (B,) the softmax's entropy over its maximum log K (`prediction_certainty`).
        labels: (B,) the images' classes among the K, or None.
        classes: the class names given (None: none); used only where there are K of them.
    """

    probabilities: Tensor
    near_chance: Tensor
    entropy: Tensor
    labels: Tensor | None = None
    classes: list[str] | None = None

    @property
    def top(self) -> tuple[Tensor, Tensor]:
        """(B,) each image's top probability and (B,) its class."""
        return self.probabilities.max(1)

    @property
    def names(self) -> list[str] | None:
        """The K class names, or None where ``classes`` are not K names."""
        count = self.probabilities.shape[1]
        return self.classes if self.classes is not None and len(self.classes) == count else None


def predictions(
    logits: Tensor, labels: Tensor | None = None, classes: Sequence[str] | None = None
) -> Predictions:
    """The `Predictions` of logits (B, K), with the images' labels (B,) among the K classes
    (not another data set's) and the classes' names, for `vizkit.viz.predictions_figure`."""
    logits = logits.detach().float().cpu()
    count = logits.shape[1]
    if labels is not None:
        labels = labels.detach().cpu()
        if len(labels) != len(logits):
            raise ValueError(f"{len(labels)} labels for {len(logits)} predictions.")
        if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < count:
            raise ValueError(
                f"labels must be classes of the model, in 0..{count - 1}; got "
                f"{int(labels.min())}..{int(labels.max())}. Pass labels=None when the images' "
                "labels belong to another data set."
            )
    entropy, _ = prediction_certainty(logits)
    classes = None if classes is None else [str(name) for name in classes]
    return Predictions(logits.softmax(-1), near_chance(logits), entropy, labels, classes)
