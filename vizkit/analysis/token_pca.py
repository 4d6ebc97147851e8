"""PCA of patch tokens: the colour maps of self-supervised ViTs (DINO, DINOv2), where the first
components of the patch features, fitted over a batch of images, separate objects and their parts
(Oquab et al., *DINOv2: Learning Robust Visual Features without Supervision*, 2023, Fig. 1).
A video model's clips give space-time patch tokens, fitted together and laid out (T', gh, gw)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.inputs import check_images
from ..hooks.selector import LayerSpec, select_layer
from .representations import token_stream_layers
from .result import Result

__all__ = ["TokenPCA", "token_pca"]


@dataclass(repr=False)
class TokenPCA(Result):
    """Principal components of the patch tokens of one layer, fitted over the batch.

    Attributes:
        projections: (B, k, gh, gw) each patch token's coordinate on each component; for a
            video model's clips (B, k, T', gh, gw), token frame by token frame.
        explained_variance_ratio: (k,) the share of the fitted tokens' variance per component.
        components: (k, C) unit directions, signed so that each one's largest loading is
            positive (a deterministic choice: PCA fixes a direction only up to sign).
        mean: (C,) the mean of the fitted tokens, subtracted before projecting.
        layer: the hook name of the layer.
        fitted: how many patch tokens the components were fitted on.
        layout, image_size: the tokens and (H, W) of the input (``layout.frames``: a clip's
            token frames T').
    """

    projections: Tensor
    explained_variance_ratio: Tensor
    components: Tensor
    mean: Tensor
    layer: str
    fitted: int
    layout: TokenLayout
    image_size: tuple[int, int]

    def rgb(self, components: tuple[int, int, int] = (0, 1, 2)) -> Tensor:
        """(B, gh, gw, 3) in [0, 1], for clips (B, T', gh, gw, 3): three components as red,
        green and blue, each min-max scaled over the whole batch (so colours compare across
        images, and across a clip's frames)."""
        valid = range(len(self.components))
        if len(components) != 3 or not all(isinstance(c, int) and c in valid for c in components):
            raise ValueError(
                f"components must be three indices in 0..{len(self.components) - 1}; got "
                f"{components!r} (fit more with token_pca(..., components=k))."
            )
        chosen = self.projections[:, list(components)].movedim(1, -1)  # (B, [T',] gh, gw, 3)
        every = tuple(range(chosen.ndim - 1))
        low = chosen.amin(every, keepdim=True)
        span = chosen.amax(every, keepdim=True) - low
        span = span.clamp_min(torch.finfo(chosen.dtype).tiny)  # a constant component: 0
        return (chosen - low) / span


@analysis_contract(videos=True)
def token_pca(
    model: nn.Module | HookedModel,
    x: Tensor,
    layer: LayerSpec = -1,
    components: int = 3,
    fit_on: Tensor | None = None,
) -> TokenPCA:
    """PCA of the patch tokens of one block's output over the batch (prefix tokens left out).

    Args:
        model: a ViT-style model whose blocks' outputs are tokens on a patch grid, or a video
            transformer.
        x: images (B, C, H, W); the components are fitted on all B·gh·gw patch tokens together.
            A video model's clips (B, T, C, H, W): on all B·T'·gh·gw space-time patch tokens.
        layer: which block output (`vizkit.hooks.select_layer`; default the last).
        components: how many components to keep (k).
        fit_on: optional (B, gh, gw) bool, for clips (B, T', gh, gw), the patch tokens to fit
            on (e.g. the foreground, as DINOv2's figure fits its second PCA on the tokens the
            first one keeps); every token is projected.

    Returns:
        `TokenPCA`, computed in float64 from an SVD of the centred tokens.

    Raises:
        ValueError: more components than the fitted tokens vary along (their numerical rank:
            none for identical tokens), features that are not finite, a ``fit_on`` of the wrong
            shape, or a model without token blocks.
    """
    hm = as_hooked(model)
    x = check_images(hm.model, x)
    image_size = tuple(x.shape[-2:])
    names = token_stream_layers(hm, image_size)
    name = select_layer(layer, names, what="block outputs")
    layout = hm.token_layout(image_size, name)
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=name)
    _, patches = layout.split(cache[name].double(), dim=1)  # (B, Np, C)
    if not torch.isfinite(patches).all():
        raise ValueError(f"The tokens of {name} hold NaN or infinite values; PCA would be NaN.")
    chosen = _fitted_tokens(patches, fit_on, layout)
    if isinstance(components, bool) or not isinstance(components, int) or components < 1:
        raise ValueError(f"components must be a positive int; got {components!r}.")
    mean = chosen.mean(0)
    _, singular, vh = torch.linalg.svd(chosen - mean, full_matrices=False)
    rank = int((singular > singular[0] * max(chosen.shape) * torch.finfo(singular.dtype).eps).sum())
    if components > rank:
        raise ValueError(
            f"components={components}, but the {len(chosen)} fitted tokens of {name} vary along "
            f"only {rank} directions (more tokens than that: more images, or a larger fit_on); "
            "the further components would be arbitrary."
        )
    directions = vh[:components]
    largest = directions.gather(1, directions.abs().argmax(1, keepdim=True))
    directions = directions * largest.sign()
    variance = singular**2
    projections = (patches - mean) @ directions.T  # (B, Np, k)
    return TokenPCA(
        projections=layout.to_grid(projections.transpose(1, 2)).float(),
        explained_variance_ratio=(variance[:components] / variance.sum()).float(),
        components=directions.float(),
        mean=mean.float(),
        layer=name,
        fitted=len(chosen),
        layout=layout,
        image_size=image_size,
    )


def _fitted_tokens(patches: Tensor, fit_on: Tensor | None, layout: TokenLayout) -> Tensor:
    """(n, C) the patch tokens of (B, Np, C) ``patches`` that ``fit_on`` selects (all if None)."""
    if fit_on is None:
        return patches.flatten(0, 1)
    expected = (len(patches), *layout.cells)
    axes = "images, patch rows, patch columns" if layout.frames is None else (
        "clips, token frames, patch rows, patch columns")  # fmt: skip
    if fit_on.dtype != torch.bool or tuple(fit_on.shape) != expected:
        raise ValueError(
            f"fit_on must be a bool tensor of shape {expected} ({axes}); got {fit_on.dtype} "
            f"{tuple(fit_on.shape)}."
        )
    return patches[fit_on.to(patches.device).flatten(1)]
