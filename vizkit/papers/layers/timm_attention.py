"""What vizkit's attention layers share with timm's `Attention`: the options timm's blocks pass
and the query/key projections."""

from __future__ import annotations

from torch import nn

__all__ = ["drop_block_options", "query_key_norms"]

_UNSUPPORTED = ("scale_norm", "gated")
_DEFAULTED = ("proj_bias", "depth", "device", "dtype")  # timm's blocks pass these
_SIZE_OPTIONS = ("attn_head_dim", "dim_out")


def drop_block_options(owner: str, options: dict, dim: int, num_heads: int) -> None:
    """Remove from ``options`` what timm's blocks pass and the layer leaves at its default;
    raise for what it cannot honour (scale_norm, gated, another head or output size), and for
    ``dim`` not divisible by ``num_heads``."""
    for unsupported in _UNSUPPORTED:
        if options.pop(unsupported, False):
            raise ValueError(f"{owner} does not support {unsupported}=True.")
    for size in _SIZE_OPTIONS:
        value = options.pop(size, None)
        if value is not None and value != (dim // num_heads if size == "attn_head_dim" else dim):
            raise ValueError(f"{owner} keeps head_dim = dim / num_heads and dim_out = dim; got "
                             f"{size}={value}.")  # fmt: skip
    for defaulted in _DEFAULTED:
        options.pop(defaulted, None)
    if dim % num_heads:
        raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}.")


def query_key_norms(
    head_dim: int, qk_norm: bool, norm_layer: type[nn.Module] | None
) -> tuple[nn.Module, nn.Module]:
    """timm's q_norm and k_norm: ``norm_layer`` (LayerNorm by default) over head_dim, or
    identities without ``qk_norm``."""
    norm = norm_layer or nn.LayerNorm
    if not qk_norm:
        return nn.Identity(), nn.Identity()
    return norm(head_dim), norm(head_dim)
