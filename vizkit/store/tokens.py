"""Which tokens of each image an activation store keeps: every token, the patches, the class
token, the register tokens, or ``k`` random patches per image (drawn from the image's index and
the store's seed, so a resumed or sharded run draws the same ones)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..hooks.layout import TokenLayout

__all__ = ["TOKEN_CHOICES", "TokenChoice", "check_tokens", "token_positions"]

TOKEN_CHOICES = ("all", "patches", "class", "registers")
TokenChoice = str | int  # one of TOKEN_CHOICES, or k: that many random patches per image


def check_tokens(tokens: TokenChoice) -> TokenChoice:
    """``tokens`` as given, or a ValueError naming the valid choices."""
    if isinstance(tokens, bool) or not isinstance(tokens, (str, int)):
        raise TypeError(f"tokens must be one of {TOKEN_CHOICES} or an int k; got {tokens!r}.")
    if isinstance(tokens, int) and tokens < 1:
        raise ValueError(
            f"tokens=k keeps k random patches per image; k must be >= 1, got {tokens}."
        )
    if isinstance(tokens, str) and tokens not in TOKEN_CHOICES:
        raise ValueError(
            f"tokens must be one of {', '.join(TOKEN_CHOICES)} or an int k (k random patches "
            f"per image); got {tokens!r}."
        )
    return tokens


def token_positions(
    tokens: TokenChoice, layout: TokenLayout, images: Tensor, seed: int, layer: str
) -> Tensor:
    """(B, T) int64: the token positions kept of each image of ``images`` (B,), the images'
    indices in the data set; refuses a choice the layer's ``layout`` does not have."""
    prefix, count = layout.num_prefix_tokens, len(images)
    if isinstance(tokens, int):
        if tokens > layout.num_patches:
            raise ValueError(
                f"tokens={tokens} random patches per image, but {layer} has "
                f"{layout.num_patches} patches ({layout.grid[0]}x{layout.grid[1]})."
            )
        drawn = [_random_patches(tokens, layout.num_patches, seed, int(i)) for i in images]
        return torch.stack(drawn) + prefix
    if tokens == "all":
        kept = torch.arange(layout.num_tokens)
    elif tokens == "patches":
        kept = torch.arange(prefix, layout.num_tokens)
    elif tokens == "class":
        if not layout.class_token:
            raise ValueError(
                f"tokens='class', but {layer} has no class token ({prefix} prefix tokens, "
                "none a class token). Use 'patches', 'registers' or 'all'."
            )
        kept = torch.tensor([0])
    else:  # registers: the prefix tokens after the class token
        kept = torch.arange(1 if layout.class_token else 0, prefix)
        if len(kept) == 0:
            raise ValueError(
                f"tokens='registers', but {layer} has no register tokens ({prefix} prefix "
                "tokens). Use 'patches', 'class' or 'all'."
            )
    return kept.expand(count, -1)


def _random_patches(k: int, patches: int, seed: int, image: int) -> Tensor:
    """(k,) sorted patch indices of one image, the same for the same (seed, image)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + image)
    return torch.randperm(patches, generator=generator)[:k].sort().values
