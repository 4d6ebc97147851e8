"""What Hugging Face transformers' vision encoders share: the attention modules that call an
attention function chosen by ``config._attn_implementation`` and return ``(output, weights)``,
and the token layout of their embeddings.

transformers is never imported here: classes are registered by name, and the modules are read
by their attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

from ...hooks.family import AttentionContext
from ...hooks.layout import TokenLayout
from ...hooks.readers import ExplicitPathReader
from ...hooks.taps import Tap

__all__ = [
    "attention_config",
    "eager_attention",
    "embedding_tokens",
    "returned_map",
    "returned_pooling_map",
    "returned_reduced_map",
]


@contextmanager
def eager_attention(config) -> Iterator[None]:
    """``config`` selects transformers' eager attention inside the block, which builds the
    softmax map and returns it as the module's second output; on exit (also after an error) it
    selects what it did before ("sdpa", "flash_attention_2", ...). Only this config object is
    switched (``_attn_implementation_internal``; the public setter also rewrites sub-configs)."""
    before = config._attn_implementation_internal
    try:
        config._attn_implementation_internal = "eager"
        yield
    finally:
        config._attn_implementation_internal = before


def attention_config(attn: nn.Module) -> object:
    """The config whose ``_attn_implementation`` the attention module reads: its own, or (as in
    transformers < 5.18, where the module wraps a ``...SelfAttention``) its first
    submodule's that holds one."""
    config = next((m.config for m in attn.modules() if hasattr(m, "config")), None)
    if config is None:
        raise TypeError(
            f"{type(attn).__name__} holds no transformers config, so vizkit cannot select its "
            "eager attention; this transformers version is not supported (see pyproject.toml)."
        )
    return config


def returned_map(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``hook_pattern`` (B, H, N, N): the weights an attention module returns beside its output
    under eager attention, the very tensor it multiplies with the values (post-softmax, and
    after attention dropout, which eval mode turns off). Read-only: the output is computed by
    the time the module returns them, so a replacement would change nothing."""
    shape = f"B H {context.tokens} {context.tokens}"
    return [_returned(path, attn, "self", shape, context.prefix_tokens, context)]


def returned_reduced_map(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``hook_pattern`` of an attention whose keys and values may be spatially reduced (PVT,
    SegFormer: a strided convolution over the token grid, ``sequence_reduction_ratio`` r):
    (B, H, Np, Np / r²) over the reduced keys (kind "pooled") where r > 1, else (B, H, Np,
    Np) (kind "self"); read as `returned_map` reads it."""
    if getattr(attn, "sequence_reduction_ratio", 1) > 1:
        return [_returned(path, attn, "pooled", "B H Np Nk", context.prefix_tokens, context)]
    return returned_map(path, attn, context)


def returned_pooling_map(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``hook_pattern`` (B, H, 1, Np): the weights a pooling head's cross-attention returns
    under eager attention, its learned query over the last block's patch tokens (as
    `returned_map` reads them)."""
    return [_returned(path, attn, "pool", "B H 1 Np", 0, context)]


def _returned(
    path: str, attn: nn.Module, kind: str, shape: str, prefix: int | None,
    context: AttentionContext,
) -> Tap:  # fmt: skip
    """The map ``attn`` returns beside its output under eager attention, as a tap."""
    config = attention_config(attn)
    read = ExplicitPathReader.returned(lambda: eager_attention(config))
    return Tap(f"{path}.hook_pattern", _returning(path, attn), read, kind=kind, shape=shape,
               prefix_tokens=prefix, grid=context.grid)  # fmt: skip


def _returning(path: str, attn: nn.Module) -> str:
    """The module that returns ``(output, weights)``: the attention module itself, or (before
    transformers 5.18, where it wraps a ``...SelfAttention`` and returns only its output) that
    inner module ``{path}.attention``."""
    inner = getattr(attn, "attention", None)
    if isinstance(inner, nn.Module) and type(inner).__name__.endswith("SelfAttention"):
        return f"{path}.attention"
    return path


def embedding_tokens(embeddings: nn.Module) -> Callable[[tuple[int, int]], TokenLayout]:
    """The token layout of a transformers ViT-style embedding: [class, distillation, registers]
    prefix tokens (those it has: ``cls_token`` or CLIP's ``class_embedding``,
    ``distillation_token``, ``register_tokens``), then the patches of an (H / ph, W / pw)
    grid."""
    classes = [getattr(embeddings, n, None) is not None for n in ("cls_token", "class_embedding")]
    prefix = any(classes) + (getattr(embeddings, "distillation_token", None) is not None)
    registers = getattr(embeddings, "register_tokens", None)
    prefix += 0 if registers is None else registers.shape[1]
    patches = getattr(embeddings, "patch_embeddings", embeddings)
    patch = getattr(patches, "patch_size", None) or patches.kernel_size  # DINOv3: a Conv2d
    ph, pw = (patch, patch) if isinstance(patch, int) else patch

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(prefix, (image_size[0] // ph, image_size[1] // pw), any(classes))

    return tokens
