"""Many edited runs of one batch in few forwards: each copy of the batch has one named
activation replaced (a patched position, an ablated head), and the copies of a chunk run as
one batch. Activation patching and ablation are built on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..hooks import HookedModel, Target
from ..hooks.passes import images_per_pass
from ..hooks.scores import call_target, is_score_target, model_logits, target_indices
from .logit_attribution import require_distinct

__all__ = ["Edit", "RunScore", "edited_scores"]

EDITED_BYTES = 2**30  # default: what one forward of edited copies may hold (1 GiB)


@dataclass(frozen=True)
class Edit:
    """One edited run: the activation ``name`` (B, ...) replaced by ``fn`` of it, and the
    edits in ``more`` (other activations of the same run)."""

    name: str
    fn: Callable[[Tensor], Tensor]
    more: tuple[Edit, ...] = ()


@dataclass(frozen=True)
class RunScore:
    """What an edited run is scored by, read off the model's raw output: the logit of class
    ``targets`` less that of ``versus`` (B,) each, or the value of a score target (a
    `vizkit.targets` helper or a callable on the output; ``targets`` None)."""

    targets: Tensor | None
    versus: Tensor | None
    score: Callable | None = None

    @classmethod
    def of(cls, output: object, target: Target, versus: Target) -> RunScore:
        """The score ``target`` and ``versus`` ask for on a batch whose clean output is
        ``output``: class indices (None: the prediction) or a score target alone."""
        if is_score_target(target):
            if versus is not None:
                raise ValueError(
                    "versus= subtracts a second class's logit; a score target has no classes. "
                    "Put the contrast in the target, e.g. vk.targets.similar_to(reference, "
                    "versus=other) or vk.targets.text(clip, prompt, versus=other_prompt)."
                )
            return cls(None, None, target)
        if callable(versus) and not isinstance(versus, Tensor):
            raise TypeError("versus must be class indices (an int or B ints), not a callable.")
        logits = model_logits(output)
        targets = target_indices(logits, target)
        other = None if versus is None else target_indices(logits, versus)
        require_distinct(targets, other)
        return cls(targets, other)

    def __call__(self, output: object, rows: Tensor) -> Tensor:
        """(n,) the score of the n rows of ``output``, row i of image ``rows[i]``."""
        if self.score is not None:
            return call_target(self.score, output, rows).float()
        logits = model_logits(output)
        index = rows.to(self.targets.device)
        score = logits.gather(1, self.targets[index][:, None].to(logits.device))[:, 0]
        if self.versus is not None:
            score = score - logits.gather(1, self.versus[index][:, None].to(logits.device))[:, 0]
        return score


def edited_scores(
    hm: HookedModel, x: Tensor, edits: Sequence[Edit], score: Callable[[object, Tensor], Tensor],
    batch_size: int | None = None, progress: bool = False, desc: str = "edited runs",
) -> Tensor:  # fmt: skip
    """(E, B, ...) ``score`` (the raw output of n images and the image (n,) each row is of ->
    (n, ...)) of the model on images x (B, C, H, W) under each of ``edits``, ``batch_size``
    images per forward (None: as many as `EDITED_BYTES` hold, measured on one image's
    forward, `vizkit.hooks.passes.images_per_pass`; at least one copy of x)."""
    if batch_size is None:
        batch_size = images_per_pass(hm.model, x, EDITED_BYTES, gradients=False, method=desc)
    per_forward = max(1, batch_size // len(x))
    scores = []
    with tqdm(total=len(edits), desc=desc, unit="run", disable=not progress, leave=False) as bar:
        for start in range(0, len(edits), per_forward):
            chunk = edits[start : start + per_forward]
            scores.append(_chunk_scores(hm, x, chunk, score))
            bar.update(len(chunk))
    return torch.cat(scores)


def _chunk_scores(
    hm: HookedModel, x: Tensor, chunk: Sequence[Edit], score: Callable[[object, Tensor], Tensor]
) -> Tensor:
    """(len(chunk), B, ...) scores of one forward of len(chunk) copies of x, copy k edited by
    ``chunk[k]``."""
    copies = len(chunk)
    by_name: dict[str, list[tuple[int, Callable[[Tensor], Tensor]]]] = {}
    for k, edit in enumerate(chunk):
        for part in (edit, *edit.more):
            by_name.setdefault(part.name, []).append((k, part.fn))

    def replace_copies(name: str) -> Callable:
        def replace(t: Tensor, *, name: str = name) -> Tensor:
            view = t.view(copies, -1, *t.shape[1:]).clone()
            for k, fn in by_name[name]:
                view[k] = fn(view[k])
            return view.reshape(t.shape)

        return replace

    fwd = {name: replace_copies(name) for name in by_name}
    rows = torch.arange(len(x), device=x.device).repeat(copies)
    with torch.no_grad(), hm.hooks(fwd=fwd):
        scores = score(hm.model(x.repeat(copies, *[1] * (x.ndim - 1))), rows)
    return scores.view(copies, len(x), *scores.shape[1:])
