"""``torch.nn.MultiheadAttention`` (torchvision's ViT blocks, SigLIP's pooling head in
transformers, open_clip's towers): its per-head map is the second output when it is called with
``need_weights=True, average_attn_weights=False``. Callers ask for ``need_weights=False`` (the
fast path), so for the call the module's keyword arguments are switched to ask for the weights;
the output is computed by the same math either way (torch's own explicit path)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from ...hooks.family import AttentionContext, Family, register_family
from ...hooks.readers import ExplicitPathReader
from ...hooks.taps import Tap

__all__ = ["returned_weights", "with_weights"]


@contextmanager
def with_weights(attn: nn.MultiheadAttention) -> Iterator[None]:
    """``attn`` returns its per-head weights (B, H, Lq, Lk) inside the block (a forward pre-hook
    rewriting ``need_weights`` and ``average_attn_weights``), removed on exit."""

    def ask_for_weights(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
        if len(args) > 4:  # need_weights passed by position: rewrite it there
            args = (*args[:4], True, *args[5:])
        else:
            kwargs = {**kwargs, "need_weights": True}
        if len(args) > 6:
            args = (*args[:6], False, *args[7:])
        else:
            kwargs = {**kwargs, "average_attn_weights": False}
        return args, kwargs

    handle = attn.register_forward_pre_hook(ask_for_weights, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def returned_weights(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``hook_pattern``: (B, H, N, N) inside a block, or (B, H, Lq, N) for a pooling head
    outside the blocks (its queries are learned latents). Read-only: the module returns the
    weights after computing its output from them, so an edit would change nothing."""
    inside = context.block is not None
    tokens = context.tokens
    read = ExplicitPathReader.returned(lambda: with_weights(attn))
    return [
        Tap(f"{path}.hook_pattern", path, read, kind="self" if inside else "pool",
            shape=f"B H {tokens} {tokens}" if inside else "B H Lq N",
            prefix_tokens=context.prefix_tokens, grid=context.grid)
    ]  # fmt: skip


FAMILY = register_family(
    Family(
        "multihead_attention",
        "torch",
        attention={nn.MultiheadAttention: returned_weights},
        outside_blocks=(nn.MultiheadAttention,),
    )
)
