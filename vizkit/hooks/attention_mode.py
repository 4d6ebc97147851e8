"""Switch timm's fused attention off for chosen modules, only inside a context."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["unfused_attention"]


@contextmanager
def unfused_attention(modules: nn.Module | Iterable[nn.Module]) -> Iterator[None]:
    """Set ``fused_attn = False`` on the given modules (or every module of a model that has the
    flag) so that they materialise their attention probabilities; restore each flag on exit, also
    after an exception.

    timm's fused path (``F.scaled_dot_product_attention``) never builds the (N, N) map, so hooks
    on ``attn_drop`` would never fire; ``timm.layers.set_fused_attn`` only affects models built
    after the call. This switches existing modules, and nothing outside the context.
    """
    if isinstance(modules, nn.Module):
        modules = modules.modules()
    saved = [(m, m.fused_attn) for m in modules if hasattr(m, "fused_attn")]
    try:
        for m, _ in saved:
            m.fused_attn = False
        yield
    finally:
        for m, flag in saved:
            m.fused_attn = flag
