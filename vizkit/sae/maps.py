"""A latent's activation over the patches of any image (one forward of the model, the layer's
tokens encoded): what `Features.heatmap` reads from the store, for images outside it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..hooks import HookedModel
from ..hooks.contract import analysis_contract, eval_mode
from ..hooks.inputs import check_images, check_indices
from .autoencoder import SparseAutoencoder
from .spliced import replaced_tokens

__all__ = ["latent_maps"]


@analysis_contract(videos=True)
def latent_maps(
    model: nn.Module | HookedModel, sae: SparseAutoencoder, x: Tensor,
    latents: Sequence[int] | None = None,
) -> Tensor:  # fmt: skip
    """(B, L, gh, gw) the activation of each of ``latents`` (default all) on each patch of
    images ``x`` (B, C, H, W); of a video model's clips (B, T, C, H, W): (B, L, T', gh, gw).
    Refuses an autoencoder whose store kept no patches."""
    x = check_images(model.model, x)
    size = tuple(x.shape[-2:])
    layer = sae.source.get("layer")
    positions = replaced_tokens(model, sae, size)  # checks the model
    layout = model.token_layout(size, layer)
    patches = positions[positions >= layout.num_prefix_tokens]
    if len(patches) != layout.num_patches:
        raise ValueError(
            f"This autoencoder was trained on tokens={sae.source['tokens']!r}, not on patches: "
            "its latents have no map over an image. Train one on a store of tokens='patches' "
            "or 'all'."
        )
    chosen = (
        list(range(sae.latents))
        if latents is None
        else check_indices("latents", latents, sae.latents, "latents")
    )
    with torch.no_grad(), eval_mode(sae):
        _, cache = model.run_with_cache(x, names=layer)
        tokens = cache[layer][:, patches].to(sae.W_dec.device)
        z = sae.encode(tokens)[..., chosen]  # (B, Np, L)
    return z.transpose(1, 2).reshape(len(x), len(chosen), *layout.cells).cpu()
