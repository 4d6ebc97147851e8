"""Many edited runs of one batch in few forwards: each copy of the batch has one named
activation replaced (a patched position, an ablated head), and the copies of a chunk run as
one batch. Activation patching and ablation are built on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..hooks import HookedModel
from ..hooks.targets import model_logits

__all__ = ["Edit", "edited_scores"]

IMAGES_PER_FORWARD = 64  # default: edited images run together


@dataclass(frozen=True)
class Edit:
    """One edited run: the activation ``name`` (B, ...) replaced by ``fn`` of it."""

    name: str
    fn: Callable[[Tensor], Tensor]


def edited_scores(
    hm: HookedModel, x: Tensor, edits: Sequence[Edit], score: Callable[[Tensor], Tensor],
    batch_size: int | None = None, progress: bool = False, desc: str = "edited runs",
) -> Tensor:  # fmt: skip
    """(E, B, ...) ``score`` (logits (B, K) -> (B, ...)) of the model on images x (B, C, H, W)
    under each of ``edits``, ``batch_size`` images per forward (None: 64; at least one copy
    of x)."""
    per_forward = max(1, (batch_size or IMAGES_PER_FORWARD) // len(x))
    scores = []
    with tqdm(total=len(edits), desc=desc, unit="run", disable=not progress, leave=False) as bar:
        for start in range(0, len(edits), per_forward):
            chunk = edits[start : start + per_forward]
            scores.append(_chunk_scores(hm, x, chunk, score))
            bar.update(len(chunk))
    return torch.cat(scores)


def _chunk_scores(
    hm: HookedModel, x: Tensor, chunk: Sequence[Edit], score: Callable[[Tensor], Tensor]
) -> Tensor:
    """(len(chunk), B, ...) scores of one forward of len(chunk) copies of x, copy k edited by
    ``chunk[k]``."""
    copies = len(chunk)
    by_name: dict[str, list[int]] = {}
    for k, edit in enumerate(chunk):
        by_name.setdefault(edit.name, []).append(k)

    def replace_copies(name: str) -> Callable:
        def replace(t: Tensor, *, name: str = name) -> Tensor:
            view = t.view(copies, -1, *t.shape[1:]).clone()
            for k in by_name[name]:
                view[k] = chunk[k].fn(view[k])
            return view.reshape(t.shape)

        return replace

    fwd = {name: replace_copies(name) for name in by_name}
    with torch.no_grad(), hm.hooks(fwd=fwd):
        logits = model_logits(hm.model(x.repeat(copies, *[1] * (x.ndim - 1))))
    return score_copies(logits, copies, score)


def score_copies(logits: Tensor, copies: int, score: Callable[[Tensor], Tensor]) -> Tensor:
    """(copies, B, ...) ``score`` of each copy's rows of ``logits`` (copies * B, K)."""
    return torch.stack([score(part) for part in logits.view(copies, -1, logits.shape[-1])])
