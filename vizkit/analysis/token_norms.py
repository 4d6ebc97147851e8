"""Token norms of the residual stream, and the high-norm tokens of Darcet et al. (2024).

*Vision Transformers Need Registers* (Darcet, Oquab, Mairal, Bojanowski; ICLR 2024), Sec. 2.1
and Fig. 3: large ViTs trained long enough (DINOv2, OpenCLIP, DeiT-III) turn a few low-information
patch tokens into "high-norm" tokens, about 10x the norm of the others in the last layers, which
hold global information and make the attention maps spiky. Their norm distribution is bimodal;
the paper separates the modes with a threshold (150 for DINOv2 ViT-g). Registers (extra prefix
tokens) take that role over and the outliers disappear.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.inputs import check_images
from ..hooks.selector import LayerSpec, select_layers
from .representations import token_stream_layers
from .result import Result
from .stages import Stages, layout_runs

__all__ = ["TokenNorms", "check_norm_cut", "high_norm_patches", "token_norms"]


def check_norm_cut(threshold: float | None, factor: float) -> None:
    """Refuse a norm cut that is not a finite number above 0 (a norm: -1 counted every patch
    as an outlier), or a ``factor`` not above 1."""
    if threshold is None:
        if not (isinstance(factor, int | float) and math.isfinite(factor) and factor > 1):
            raise ValueError(f"factor must be a number > 1 (times the median); got {factor!r}.")
    elif not (isinstance(threshold, int | float) and not isinstance(threshold, bool)
              and math.isfinite(threshold) and threshold > 0):  # fmt: skip
        raise ValueError(
            f"threshold must be a finite number > 0 (a norm: patches above it are outliers); "
            f"got {threshold!r}. Pass None to cut at factor times each image's median norm."
        )


def high_norm_patches(norms: Tensor, threshold: float | None = None, factor: float = 4.0) -> Tensor:
    """(..., Np) bool: the patches whose norm (..., Np) exceeds ``threshold``, or by default
    ``factor`` times the median over the last axis (the outliers of Darcet et al. are about 10x
    the others; a model without them flags none). A clip's Np are its space-time patches."""
    check_norm_cut(threshold, factor)
    if threshold is None:
        return norms > factor * norms.quantile(0.5, dim=-1, keepdim=True)  # midpoint of two
    return norms > threshold


@dataclass(repr=False)
class TokenNorms(Result):
    """L2 norm of every token of each chosen layer's output.

    Attributes:
        prefix: (B, L, P) norms of the prefix tokens (class, registers, distillation).
        patches: (B, L, gh, gw) norms of the patch tokens on the grid; for a video model's
            clips (B, L, T', gh, gw), token frame by token frame (``layout.frames`` = T').
        layers: the block outputs' hook names, in forward order.
        layout: the tokens of those layers (one layout for all: refused otherwise).
        image_size: (H, W) of the input (of each frame, for clips).
    """

    prefix: Tensor
    patches: Tensor
    layers: list[str]
    layout: TokenLayout
    image_size: tuple[int, int]

    def high_norm(self, threshold: float | None = None, factor: float = 4.0) -> Tensor:
        """(B, L, gh, gw) bool, for clips (B, L, T', gh, gw): the patch tokens whose norm
        exceeds ``threshold`` (the paper's fixed cut, e.g. 150 for DINOv2 ViT-g), or by default
        ``factor`` times the median patch norm of their image (clip: over all its frames) and
        layer (`high_norm_patches`)."""
        flat = self.patches.flatten(2)  # (B, L, Np)
        return high_norm_patches(flat, threshold, factor).view_as(self.patches)

    def high_norm_fraction(self, threshold: float | None = None, factor: float = 4.0) -> Tensor:
        """(L,) the fraction of patch tokens that `high_norm` flags, per layer."""
        flags = self.high_norm(threshold, factor).float()
        return flags.transpose(0, 1).flatten(1).mean(1)


@analysis_contract(videos=True)
def token_norms(
    model: nn.Module | HookedModel, x: Tensor, layers: LayerSpec | None = None
) -> TokenNorms | Stages:
    """The L2 norm over channels of every token in each block's output (the residual stream).

    Args:
        model: a ViT-style model whose blocks' outputs are tokens on a patch grid, or a video
            transformer.
        x: images (B, C, H, W), or a video model's clips (B, T, C, H, W).
        layers: which block outputs (`vizkit.hooks.select_layers`: ints count the block outputs,
            negative from the end); default all. Layers asked for must share one layout (the
            blocks of one stage for a hierarchical model, e.g. ``"layers.3.*"`` for Swin).

    Returns:
        `TokenNorms`: prefix (B, L, P) and patch (B, L, gh, gw) norms (clips: (B, L, T', gh,
        gw)), in float32; by default
        on a model whose blocks hold different tokens, `Stages` of one `TokenNorms` per run of
        blocks sharing a layout (the stages of a hierarchical model).

    Raises:
        ValueError: a model without token blocks (a CNN), or layers whose tokens differ.
    """
    hm = as_hooked(model)
    x = check_images(hm.model, x)
    image_size = tuple(x.shape[-2:])
    names = token_stream_layers(hm, image_size)
    chosen = names if layers is None else select_layers(layers, names, what="block outputs")
    groups = layout_runs(hm, chosen, image_size) if layers is None else [chosen]
    layouts = [_one_layout(hm, image_size, group) for group in groups]
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=chosen)
    results = []
    for group, layout in zip(groups, layouts, strict=True):
        norms = torch.stack([cache[n].float().norm(dim=-1) for n in group], dim=1)  # (B, L, N)
        if not torch.isfinite(norms).all():
            raise ValueError("Some token norms are NaN or infinite; check the model and the input.")
        prefix, patches = layout.split(norms, dim=-1)
        results.append(TokenNorms(prefix, layout.to_grid(patches), group, layout, image_size))
    return results[0] if len(results) == 1 else Stages(results, image_size)


def _one_layout(hm: HookedModel, image_size, names: list[str]) -> TokenLayout:
    """The layout the chosen layers share; refuses layers of different layouts, naming the
    block outputs (as ints counting them) of each."""
    layouts = {name: hm.token_layout(image_size, name) for name in names}
    if len(set(layouts.values())) == 1:
        return layouts[names[0]]
    everything = token_stream_layers(hm, image_size)
    groups: dict[TokenLayout, list[int]] = {}
    for name, layout in layouts.items():
        groups.setdefault(layout, []).append(everything.index(name))
    parts = "; ".join(
        f"layers {g}: {lay.num_prefix_tokens} prefix + {lay.grid[0]}x{lay.grid[1]} patches"
        for lay, g in groups.items()
    )
    raise ValueError(
        f"The chosen layers hold different tokens ({parts}), so their norms cannot be stacked; "
        f"choose the layers of one stage, e.g. layers={list(groups.values())[-1]}."
    )
