"""What the decomposition says about the whole embedding over a data set: how much zero-shot
accuracy survives when parts are replaced by their mean over the images (Gandelsman, Efros and
Steinhardt 2024, Sec. 3.2, Tab. 1-2: the last attention layers carry the accuracy), and how much
of each head's variance a labelling of the images explains (its between-group share, the
correlation ratio eta^2: a head whose outputs are the mean of each shape's images is a shape
head)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..analysis.result import Result
from ..hooks import TokenLayout
from ..models.zero_shot import zero_shot_predictions
from .decomposition import EmbeddingDecomposition

__all__ = [
    "LabelShares",
    "MeanAblation",
    "label_shares",
    "mean_ablated",
    "mean_ablation",
]


def mean_ablated(decomposition: EmbeddingDecomposition, kept: Sequence[str]) -> Tensor:
    """(n, D) the embeddings with every part not in ``kept`` (names of ``parts``) replaced by
    its mean over the images."""
    unknown = [p for p in kept if p not in decomposition.parts]
    if unknown:
        raise ValueError(f"{unknown} are not parts; the parts are {decomposition.parts}.")
    parts = decomposition.contributions
    keep = torch.tensor([p in kept for p in decomposition.parts])[None, :, None]
    mixed = torch.where(keep, parts, parts.mean(0, keepdim=True))
    return mixed.sum(1) + decomposition.constant


@dataclass(repr=False)
class MeanAblation(Result):
    """Zero-shot accuracy with parts mean-ablated.

    Attributes:
        names: what each row ablates ("nothing", "the embedding and every MLP", ...).
        ablated: per row, the parts replaced by their mean.
        accuracy: (R,) the zero-shot accuracy of each row's embeddings.
    """

    names: list[str]
    ablated: list[list[str]]
    accuracy: Tensor
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None


def mean_ablation(
    decomposition: EmbeddingDecomposition, text_embeddings: Tensor, labels: Tensor
) -> MeanAblation:
    """Zero-shot accuracy over the decomposed images (``labels`` (n,) index the K class
    ``text_embeddings`` (K, D)) with nothing ablated, with the stream entering the first block
    and every MLP ablated, and with the attention of every block before block l ablated too,
    for each l (the last row keeps the last block's attention only)."""
    labels = torch.as_tensor(labels).cpu()
    if labels.shape != (len(decomposition.embedding),):
        raise ValueError(
            f"labels must hold one class per decomposed image ({len(decomposition.embedding)}); "
            f"got shape {tuple(labels.shape)}."
        )
    parts = decomposition.parts
    attention = [p for p in parts if p.endswith(" attn")]
    others = [p for p in parts if p not in attention]
    names, ablated = ["nothing", "the embedding and every MLP"], [[], others]
    for i, block in enumerate(decomposition.blocks[1:], start=1):
        names.append(f"the above and the attention before {block}")
        ablated.append(others + attention[:i])
    accuracy = torch.zeros(len(names))
    for row, gone in enumerate(ablated):
        embeddings = mean_ablated(decomposition, [p for p in parts if p not in gone])
        right = zero_shot_predictions(embeddings, text_embeddings) == labels
        accuracy[row] = right.float().mean()
    return MeanAblation(names, ablated, accuracy, layout=decomposition.layout,
                        image_size=decomposition.image_size)  # fmt: skip


@dataclass(repr=False)
class LabelShares(Result):
    """How much of each head's variance over the images each labelling explains.

    Attributes:
        blocks: the blocks (L); labellings: their names (A).
        shares: (L, H, A) between-group variance / total variance of each head's direct
            contribution (as a share of the cosine: divided by the embedding norm).
        variance: (L, H) each head's total variance.
    """

    blocks: list[str]
    labellings: list[str]
    shares: Tensor
    variance: Tensor
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def strongest(self, labelling: str, count: int = 3) -> list[tuple[str, int, float]]:
        """The ``count`` heads whose variance ``labelling`` explains most, as (block, head,
        share)."""
        a = self.labellings.index(labelling)
        flat = self.shares[..., a].flatten()
        heads = self.shares.shape[1]
        return [(self.blocks[i // heads], i % heads, float(flat[i]))
                for i in flat.argsort(descending=True)[:count].tolist()]  # fmt: skip


def label_shares(
    decomposition: EmbeddingDecomposition, labellings: dict[str, Sequence]
) -> LabelShares:
    """The share of each head's variance explained by each labelling of the images (a name ->
    one label per image: the shape, the colour, the position...): the variance of the label
    groups' means, weighted by group size, over the total (eta^2 of a one-way ANOVA)."""
    data = decomposition.head_shares()
    centred = data - data.mean(0)
    total = centred.pow(2).sum((0, 3))  # (L, H)
    shares = []
    for name, labels in labellings.items():
        labels = list(labels)
        if len(labels) != len(data):
            raise ValueError(f"{name!r} has {len(labels)} labels for {len(data)} images.")
        groups = torch.tensor([sorted(set(labels)).index(v) for v in labels])
        between = torch.zeros_like(total)
        for g in range(int(groups.max()) + 1):
            members = centred[groups == g]
            between += len(members) * members.mean(0).pow(2).sum(-1)
        shares.append(between / total.clamp_min(1e-30))
    return LabelShares(
        list(decomposition.blocks), list(labellings), torch.stack(shares, -1),
        total / len(data), layout=decomposition.layout, image_size=decomposition.image_size,
    )  # fmt: skip
