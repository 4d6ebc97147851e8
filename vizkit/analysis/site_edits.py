"""The sites activation patching and ablation edit, one vocabulary for both, and the one
builder of their edits: each component of a site set to a source's value. Patching takes the
source from the clean run; ablation from a reference made by zeroing, averaging or resampling
(Heimersheim and Nanda 2024, "How to use and interpret activation patching", Sec. 2).

A head's output is its term W_O^h z_h of the attention output (`head_outputs`), so a head is
edited by adding the difference of two such terms to that output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from ..hooks import HookedModel
from .component_edits import Edit
from .residual_stream import head_outputs

__all__ = ["SITES", "SiteSource", "site_edits"]

# site -> what one edit of it sets
SITES = {
    "resid": "the stream entering each block, at one token position",
    "positions": "the stream entering the first block (the embedded tokens), at one position",
    "attn": "each block's attention output",
    "mlp": "each block's MLP output",
    "heads": "each head's output",
}


@dataclass(frozen=True)
class SiteSource:
    """The values a site is set to: the activations ``acts`` of the source run on ``images``
    (R, C, H, W), each passed through ``value`` ((R, ...) -> (B, ...): the clean run's own
    values when patching; zero, the mean or a resampled image's when ablating)."""

    images: Tensor
    acts: dict[str, Tensor]
    value: Callable[[Tensor], Tensor]


def site_edits(
    hm: HookedModel, site: str, blocks: list[str], x: Tensor, acts: dict[str, Tensor],
    source: SiteSource,
) -> tuple[list[Edit], list[str]]:  # fmt: skip
    """The edits of ``site`` (a key of `SITES`) for the run on images x (B, C, H, W) whose
    block activations are ``acts``, each setting one component to ``source``'s value, and
    their labels ("blocks.3 head 2", "blocks.1 mlp", "blocks.2 position 5", "position 5")."""
    if site in ("resid", "positions"):
        chosen = blocks if site == "resid" else blocks[:1]
        require_aligned_tokens(hm, x, acts, chosen)
        edits, labels = [], []
        for b in chosen:
            stream = source.acts[f"{b}.hook_resid_pre"]  # (R, N, C)
            for p in range(stream.shape[1]):
                edits.append(Edit(f"{b}.hook_resid_pre",
                                  _replace_position(p, source.value(stream[:, p]))))  # fmt: skip
                labels.append(f"position {p}" if site == "positions" else f"{b} position {p}")
        return edits, labels
    if site in ("attn", "mlp"):
        names = [f"{b}.hook_{site}_out" for b in blocks]
        edits = [Edit(n, _replace(source.value(source.acts[n]))) for n in names]
        return edits, [f"{b} {site}" for b in blocks]
    attn = [f"{b}.hook_attn_out" for b in blocks]
    own = head_outputs(hm, x, blocks, [acts[n] for n in attn])
    theirs = own if source.acts is acts else head_outputs(
        hm, source.images, blocks, [source.acts[n] for n in attn])  # fmt: skip
    edits, labels = [], []
    for b, name, mine, other in zip(blocks, attn, own, theirs, strict=True):
        for h in range(len(mine) - 1):  # the last term is the output's bias
            edits.append(Edit(name, _add(source.value(other[h]) - mine[h])))
            labels.append(f"{b} head {h}")
    return edits, labels


def require_aligned_tokens(
    hm: HookedModel, x: Tensor, acts: dict[str, Tensor], blocks: list[str]
) -> None:  # fmt: skip
    """Refuse per-position sites where a block's stream is not the model's tokens (prefix,
    then the patch grid): positions would not line up across blocks (ConViT's class token
    joins late; a hierarchical model's stages)."""
    layout = hm.token_layout(tuple(x.shape[-2:]))
    expected = None if layout is None else layout.num_tokens
    counts = {b: acts[f"{b}.hook_resid_pre"].shape[1] for b in blocks}
    odd = {b: n for b, n in counts.items() if n != expected}
    if odd:
        raise ValueError(
            f"The stream entering {', '.join(list(odd)[:3])} holds {sorted(set(odd.values()))} "
            f"tokens, not the model's {expected} (prefix tokens, then the patch grid), so its "
            "positions do not line up with the other blocks' or the image; patch whole "
            "outputs (sites=('attn', 'mlp')) or a region instead."
        )


def _replace_position(position: int, value: Tensor) -> Callable[[Tensor], Tensor]:
    def fn(t: Tensor) -> Tensor:  # (B, N, C)
        t[:, position] = value
        return t

    return fn


def _add(delta: Tensor) -> Callable[[Tensor], Tensor]:
    return lambda t: t + delta


def _replace(value: Tensor) -> Callable[[Tensor], Tensor]:
    return lambda t: value.expand_as(t).clone()
