"""Zero-shot segmentation from the decomposition (Gandelsman, Efros and Steinhardt 2024, Sec. 5.1):
each patch's share of the cosine between the image embedding and a text, summed over the heads
of the token blocks, is a map of where the image matches the text, scored against object masks
with `vizkit.metrics` (pointing game, top IoU, relevance rank accuracy)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from ..analysis.saliency_result import SaliencyResult
from .decomposition import EmbeddingDecomposition

__all__ = ["text_maps"]


def text_maps(
    decomposition: EmbeddingDecomposition, text_embeddings: Tensor, targets: Tensor | int,
    blocks: Sequence[str] | None = None, versus_mean: bool = False,
) -> SaliencyResult:  # fmt: skip
    """(B, gh, gw) each image's patches' shares of its cosine with text ``targets`` (an int
    or B ints indexing the K ``text_embeddings`` (K, D)), through every head of ``blocks``
    (default: the decomposition's token blocks).

    Args:
        versus_mean: subtract the mean map over the K texts (what is specific to the target
            text, not what every text shares).
    """
    shares = decomposition.token_cosine(text_embeddings, blocks)  # (B, K, N)
    count = len(shares)
    valid = f"an int or {count} ints in [0, {shares.shape[1]}) (rows of the text embeddings)"
    flat = (
        targets.reshape(-1).tolist()
        if isinstance(targets, Tensor)
        else list(targets) if isinstance(targets, Sequence) else [targets]
    )  # fmt: skip
    if any(isinstance(t, bool) or not isinstance(t, numbers.Integral) for t in flat):
        raise TypeError(f"targets must be {valid}; got {flat}: an index is never rounded.")
    targets = torch.tensor(flat, dtype=torch.long)
    targets = targets.expand(count) if len(flat) == 1 else targets
    if targets.shape != (count,) or not bool(((targets >= 0) & (targets < shares.shape[1])).all()):
        raise ValueError(f"targets must be {valid}; got {flat}.")
    chosen = shares[torch.arange(count), targets]  # (B, N)
    if versus_mean:
        chosen = chosen - shares.mean(1)
    layout = decomposition.layout
    _, patches = layout.split(chosen, dim=1)
    return SaliencyResult(
        layout.to_grid(patches), "text_span_tokens", decomposition.image_size,
        options={"blocks": list(blocks or decomposition.token_blocks), "versus_mean": versus_mean},
        layout=layout, targets=targets,
    )  # fmt: skip
