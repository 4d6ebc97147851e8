"""Corrupted images for patching, and whether a corruption changes the score at all.

A circuit is found between a clean and a corrupted run, so the corruption decides the question
asked (Heimersheim and Nanda 2024, "How to use and interpret activation patching", Sec. 3):
another image of the batch (what tells this image from others), noise added (which components
the answer survives), the object removed (what reads the object), or counterfactual scenes that
differ in one known way (`vizkit.datasets.counterfactual_shapes`: the Shapes scene without its
object or with another in its place), or the user's own pairs. A corruption that leaves the
score where it was makes every effect zero; `corruption_effect` flags it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..analysis.component_edits import RunScore
from ..analysis.result import Result
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice, check_images
from ..hooks.scores import model_logits
from ..hooks.training_mode import warn_caller

__all__ = [
    "CORRUPTIONS",
    "CorruptionEffect",
    "corrupt",
    "corruption_effect",
    "score_scale",
    "warn_if_unchanged",
]

CORRUPTIONS = ("other", "noise", "erase")
UNCHANGED = 0.01  # a change below this share of the score's scale is no change


def corrupt(
    x: Tensor, how: str = "other", masks: Tensor | None = None, noise: float = 1.0, seed: int = 0
) -> Tensor:
    """Corrupted copies (B, C, H, W) of images x (B, C, H, W).

    Args:
        how: "other" (each image replaced by the next one of the batch, the last by the
            first), "noise" (Gaussian noise of ``noise`` times the batch's standard deviation
            added, drawn with ``seed``) or "erase" (the pixels of ``masks`` (B, H, W) set to the
            mean of the image's other pixels).
    """
    check_choice("how", how, CORRUPTIONS)
    if x.ndim != 4:
        raise ValueError(f"x must be images (B, C, H, W); got {tuple(x.shape)}.")
    if how == "other":
        if len(x) < 2:
            raise ValueError("how='other' replaces each image by another of the batch; give 2+.")
        return x.roll(-1, 0)
    if how == "noise":
        generator = torch.Generator().manual_seed(seed)
        drawn = torch.randn(x.shape, generator=generator, dtype=torch.float32)
        return x + noise * x.float().std() * drawn.to(x.device, x.dtype)
    if masks is None or masks.shape != (len(x), *x.shape[-2:]):
        got = None if masks is None else tuple(masks.shape)
        raise ValueError(f"how='erase' needs masks (B, H, W) of the images' size; got {got}.")
    inside = masks.to(x.device, torch.bool)[:, None]  # (B, 1, H, W)
    outside = (~inside).to(x.dtype)
    mean = (x * outside).sum((2, 3), keepdim=True) / outside.sum((2, 3), keepdim=True).clamp_min(1)
    return torch.where(inside, mean, x)


@dataclass(repr=False)
class CorruptionEffect(Result):
    """The score on clean and corrupted images.

    Attributes:
        clean_score, corrupted_score, change: (B,) each; scale: (B,) what a change is measured
            against (the spread of the clean logits over the classes, or the clean score of a
            score target); unchanged: (B,) bool, |change| below `UNCHANGED` of the scale.
    """

    clean_score: Tensor
    corrupted_score: Tensor
    change: Tensor
    scale: Tensor
    unchanged: Tensor
    options: dict = field(default_factory=dict)

    def summary(self) -> str:
        """One line: the mean change and how many images it leaves unchanged."""
        count = int(self.unchanged.sum())
        said = f"; unchanged on {count} of {len(self.change)} images" if count else ""
        return f"corruption changes the score by {float(self.change.mean()):+.3g} on average{said}"


@analysis_contract
def corruption_effect(
    model: nn.Module | HookedModel, clean: Tensor, corrupted: Tensor, target: Target = None,
    versus: Target = None,
) -> CorruptionEffect:  # fmt: skip
    """The score's change from ``clean`` to ``corrupted`` images (B, C, H, W) each, target and
    versus as `attribution_patching`; images whose score the corruption leaves where it was
    are flagged (``unchanged``)."""
    clean, corrupted = check_images(model.model, clean), check_images(model.model, corrupted)
    with torch.no_grad():
        clean_out, corrupted_out = model.model(clean), model.model(corrupted)
    score = RunScore.of(clean_out, target, versus)
    rows = torch.arange(len(clean), device=clean.device)
    high, low = score(clean_out, rows), score(corrupted_out, rows)
    scale = score_scale(clean_out, score, high)
    change = low - high
    return CorruptionEffect(high, low, change, scale, change.abs() <= UNCHANGED * scale)


def score_scale(clean_out: object, score: RunScore, clean_score: Tensor) -> Tensor:
    """(B,) what a change of the score is measured against: the spread of the clean logits
    over the classes for a class score, the clean score's magnitude for a score target."""
    if score.targets is None:
        return clean_score.abs()
    return model_logits(clean_out).float().std(1)


def warn_if_unchanged(clean_out: object, score: RunScore, high: Tensor, low: Tensor) -> None:
    """Warn where the corruption leaves the score of every image where it was."""
    scale = score_scale(clean_out, score, high)
    if bool(((low - high).abs() <= UNCHANGED * scale).all()):
        warn_caller(
            "The corrupted images leave the score where it was on every image, so every "
            "patching effect is zero or noise: choose a corruption that changes the answer "
            "(vk.circuits.corruption_effect measures it)."
        )
