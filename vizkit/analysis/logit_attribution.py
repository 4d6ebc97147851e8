"""Direct logit attribution: how much each part of the residual stream writes the explained
score directly, through the head, with the head's norms frozen at their clean scale.

With s = x_0 + Σ_l (attn_l + mlp_l) the final stream and the frozen head affine,
score(head(s)) = Σ_parts Σ_positions <∂score/∂s, part> + score(head(0)) exactly; each
attention output splits further into its heads' W_O^h z_h and the bias b_O (Elhage et al.
2021, "A Mathematical Framework for Transformer Circuits"; TransformerLens' ``logit_attrs``).
"Direct" leaves out what a part does through later blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..hooks import HookedModel, Target, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_images
from ..hooks.scores import model_logits, target_indices
from .residual_stream import (
    StreamReadout,
    head_outputs,
    require_full_precision,
    residual_blocks,
    stream_parts,
)
from .result import Result

__all__ = [
    "LogitAttribution",
    "direct_logit_attribution",
    "logit_score",
    "require_class_indices",
]


@dataclass(repr=False)
class LogitAttribution(Result):
    """The explained score of each image split into the stream's parts.

    Attributes:
        parts: "embed" (the stream entering the first block), then "<block> attn" and
            "<block> mlp" per block.
        contributions: (B, P) each part's direct contribution; with ``constant`` they sum to
            ``score``.
        per_position: (B, P, N) the same per token position (prefix tokens first).
        constant: (B,) the head's value on a zero stream (its biases, through the norms).
        score: (B,) the explained score: the ``targets`` logit, less the ``versus`` logit.
        targets, versus: (B,) the classes (``versus`` None for a plain logit).
        blocks: the block paths; heads: (B, L, H) each head's direct contribution (its part of
            "<block> attn" less the output bias), None where the heads do not split
            (``notes["heads"]`` says why); heads_per_position: (B, L, H, N).
        notes: what was left out, and why.
        options, layout, image_size: as every result.
    """

    parts: list[str]
    contributions: Tensor
    per_position: Tensor
    constant: Tensor
    score: Tensor
    targets: Tensor
    versus: Tensor | None
    blocks: list[str]
    heads: Tensor | None = None
    heads_per_position: Tensor | None = None
    notes: dict[str, str] = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def top_heads(self, count: int = 10) -> list[tuple[str, int, float]]:
        """The ``count`` heads of largest mean |contribution| over the images, as (block, head,
        mean contribution)."""
        if self.heads is None:
            raise ValueError(f"No per-head split: {self.notes.get('heads', '')}")
        mean = self.heads.mean(0)  # (L, H)
        order = mean.abs().flatten().argsort(descending=True)[:count].tolist()
        heads = mean.shape[1]
        return [(self.blocks[i // heads], i % heads, float(mean.flatten()[i])) for i in order]


def require_class_indices(target: Target, versus: Target) -> None:
    """Refuse a callable ``target`` or ``versus``: the views score a logit or a difference of
    two, so both are class indices (an int or B ints) or None."""
    for name, value in (("target", target), ("versus", versus)):
        if callable(value) and not isinstance(value, Tensor):
            raise TypeError(
                f"The mechanistic views score a logit (or a difference of two), so {name} must "
                "be class indices (an int or B ints), not a callable."
            )


def require_distinct(targets: Tensor, versus: Tensor | None) -> None:
    """Refuse a ``versus`` class equal to the target class of some image: its logit
    difference is zero whatever the model does."""
    if versus is not None and bool((same := targets == versus.to(targets.device)).any()):
        images = same.nonzero()[:, 0].tolist()
        raise ValueError(
            f"versus is the target class for images {images}: a logit less itself is 0 "
            "whatever the model does. Pass another class as versus, or versus=None."
        )


def logit_score(logits: Tensor, targets: Tensor, versus: Tensor | None) -> Tensor:
    """(B,) the ``targets`` logit of each row of ``logits`` (B, K), less the ``versus`` one."""
    score = logits.gather(1, targets[:, None].to(logits.device))[:, 0]
    if versus is not None:
        score = score - logits.gather(1, versus[:, None].to(logits.device))[:, 0]
    return score


@analysis_contract(
    classifier="direct logit attribution splits a class logit along the classifier head's "
    "linear readout of the residual stream"
)
def direct_logit_attribution(
    model: nn.Module | HookedModel,
    x: Tensor,
    target: Target = None,
    versus: Target = None,
    heads: bool = True,
) -> LogitAttribution:
    """The direct contribution of the embedding, each attention and MLP output, each head and
    each token position to the ``target`` logit (or its difference to the ``versus`` logit) of
    images x (B, C, H, W).

    Args:
        target: the class explained: an int, B ints, or None for each image's prediction.
        versus: a second class (int, B ints) whose logit is subtracted; None: the plain logit.
        heads: also split each attention output by head (one forward of (H + 1) x B images
            per block).

    Raises:
        ValueError: a model whose stream is not one sum of block outputs, or whose head is not
            affine once its norms are frozen (the message says which); a callable target.
    """
    x = check_images(model.model, x)
    require_class_indices(target, versus)
    require_full_precision(x, "Direct logit attribution")
    parts, labels, final, output = stream_parts(model, x)
    logits = model_logits(output)
    targets = target_indices(logits, target)
    other = None if versus is None else target_indices(logits, versus)
    require_distinct(targets, other)
    blocks = residual_blocks(model)
    readout = StreamReadout(model, x, blocks)
    gradient, constant = readout.linear_score(lambda out: logit_score(out, targets, other))
    per_position = (parts * gradient).sum(-1).transpose(0, 1)  # (B, P, N)
    _check_additive(readout, parts, per_position.sum(-1), constant, targets, other)
    result = LogitAttribution(
        labels, per_position.sum(-1), per_position, constant, logit_score(logits, targets, other),
        targets, other, blocks,
        options={"heads": heads}, layout=model.token_layout(tuple(x.shape[-2:])),
        image_size=tuple(x.shape[-2:]),
    )  # fmt: skip
    if heads:
        try:
            split = torch.stack(
                head_outputs(model, x, blocks, list(parts[1::2]))
            )  # (L, H+1, B, N, C)
        except ValueError as error:
            result.notes["heads"] = str(error)
        else:
            by_head = (split[:, :-1] * gradient).sum(-1)  # (L, H, B, N)
            result.heads_per_position = by_head.permute(2, 0, 1, 3)
            result.heads = result.heads_per_position.sum(-1)
    return result


def _check_additive(
    readout: StreamReadout, parts: Tensor, contributions: Tensor, constant: Tensor,
    targets: Tensor, versus: Tensor | None,
) -> None:  # fmt: skip
    """Each part alone through the frozen head gives its contribution: the head is additive
    over the parts, not only affine at the clean stream (a max pooling is piecewise linear and
    passes that check).

    Raises:
        ValueError: a part whose own reading differs from its contribution."""
    with torch.no_grad():
        alone = torch.stack([logit_score(readout(part, frozen=True), targets, versus)
                             for part in parts], 1) - constant[:, None]  # fmt: skip
    scale = contributions.abs().max().clamp_min(1e-12)
    error = float((alone - contributions).abs().max() / scale)
    if not error <= 1e-4:
        raise ValueError(
            f"Each part read alone through the frozen head differs from its contribution by "
            f"{error:.1e} of their scale: the head is not additive over the stream's parts (a "
            "max pooling, or another head that is only piecewise linear), so a direct logit "
            "attribution would be a linearisation at these images, not a decomposition."
        )
