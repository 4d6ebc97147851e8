"""A model without a text tower read in a text-image model's space, the idea of Balasubramanian
et al. (NeurIPS 2024, "Decomposing and Interpreting Image Representations via Text in ViTs Beyond
CLIP", Sec. 3): a linear map fitted from the model's image embedding to the text-image model's
over a data set. The map is linear, so the model's decomposition goes through it term by term
(its bias joins the constant), and TextSpan's text basis, mean ablation and maps apply to the
mapped parts. What the map cannot fit (its held-out R^2 and cosine) is where the reading breaks:
a text the backbone's embedding does not carry has no image direction to read."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.result import Result
from ..hooks import TokenLayout
from ..hooks.inputs import check_number
from ..models.zero_shot import image_tower
from ..targets import embed
from .decomposition import EmbeddingDecomposition

__all__ = ["TextMap", "fit_text_map"]


@dataclass(repr=False)
class TextMap(Result):
    """``y = weight x + bias``: a model's embeddings x (n, D_model) to a text-image model's unit
    image embeddings y (n, D_text).

    Attributes:
        weight: (D_text, D_model); bias: (D_text,).
        scores: on the held-out images: ``r2`` (the share of the targets' variance the map
            explains), ``cosine`` (mean cosine of mapped and true embeddings); the same with
            ``fit_`` on the images it was fitted on; ``images`` of each.
    """

    weight: Tensor
    bias: Tensor
    scores: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def __call__(self, embeddings: Tensor) -> Tensor:
        """(n, D_text) the mapped ``embeddings`` (n, D_model)."""
        if embeddings.shape[-1] != self.weight.shape[1]:
            raise ValueError(
                f"The map takes {self.weight.shape[1]}-wide embeddings (the model it was fitted "
                f"on); got {embeddings.shape[-1]}."
            )
        return embeddings.float() @ self.weight.T + self.bias

    def decomposition(self, split: EmbeddingDecomposition) -> EmbeddingDecomposition:
        """``split`` of the model's embedding carried into the text-image space: every part,
        head and token through the weight, the bias added to the constant (the mapped parts
        and constant sum to the mapped embedding)."""

        def carry(t: Tensor | None) -> Tensor | None:
            return None if t is None else t @ self.weight.T

        return EmbeddingDecomposition(
            split.parts, carry(split.contributions), carry(split.constant) + self.bias,
            self(split.embedding), split.blocks, carry(split.heads), split.token_blocks,
            carry(split.tokens), {**split.notes, "text_map": "carried through a fitted map"},
            split.options, split.layout, split.image_size,
        )  # fmt: skip


def fit_text_map(
    model: nn.Module, text_model: nn.Module, images: Tensor, ridge: float = 1e-3,
    held_out: float = 0.2, batch_size: int = 64,
) -> TextMap:  # fmt: skip
    """The least-squares linear map (ridge ``ridge`` times the mean variance of the model's
    embedding dimensions) from ``model``'s image embeddings to ``text_model``'s unit image
    embeddings of ``images`` (n, C, H, W, prepared for both), fitted on all but the last
    ``held_out`` share of them and scored on those."""
    ridge = check_number("ridge", ridge, 0.0)
    held_out = check_number("held_out", held_out, 0.0, 1.0, high_open=True)
    x = embed(model, images, batch_size).float()
    y = F.normalize(embed(image_tower(text_model), images, batch_size).float(), dim=-1)
    cut = len(images) - int(round(held_out * len(images)))
    if cut < 2 or (held_out and cut == len(images)):
        raise ValueError(
            f"{len(images)} images leave {cut} to fit the map and "
            f"{len(images) - cut} to score it; pass more images."
        )
    x_mean, y_mean = x[:cut].mean(0), y[:cut].mean(0)
    xc, yc = x[:cut] - x_mean, y[:cut] - y_mean
    gram = xc.T.double() @ xc.double()
    gram += ridge * gram.trace() / len(gram) * torch.eye(len(gram), dtype=gram.dtype)
    weight = torch.linalg.solve(gram, xc.T.double() @ yc.double()).T.float()
    bias = y_mean - weight @ x_mean
    fitted = TextMap(weight, bias, options={"ridge": ridge, "held_out": held_out})
    fitted.scores = {**_scores(fitted, x[:cut], y[:cut], "fit_"),
                     **_scores(fitted, x[cut:], y[cut:])}  # fmt: skip
    return fitted


def _scores(fitted: TextMap, x: Tensor, y: Tensor, prefix: str = "") -> dict:
    if not len(x):
        return {}
    mapped = fitted(x)
    r2 = 1 - float((mapped - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum().clamp_min(1e-30))
    cosine = float(F.cosine_similarity(mapped, y, dim=-1).mean())
    return {f"{prefix}r2": r2, f"{prefix}cosine": cosine, f"{prefix}images": len(x)}
