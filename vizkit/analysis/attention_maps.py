"""`attention`: capture post-softmax self-attention patterns with their token layout."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.heads import HeadSpec, reduce_heads
from ..hooks.inputs import (
    DEFAULT_MAX_BYTES,
    check_choice,
    check_count,
    check_image_batch,
    check_images,
    check_values_finite,
)
from ..hooks.selector import LayerSpec, select_layer
from . import attention_stats as stats
from ._model import (
    applied_attention_names,
    attention_names,
    float_bytes,
    grid_map,
    layer_index,
    query_index,
    token_pixels,
    without_applied_suffix,
)
from .result import Result
from .stages import Stages, layout_runs

__all__ = [
    "AttentionResult",
    "attention",
    "attention_bytes",
    "common_layout",
    "stage_layers",
]


@dataclass(repr=False)
class AttentionResult(Result):
    """Self-attention patterns of a batch and where their tokens sit.

    Attributes:
        patterns: (L, B, H, Nq, N) post-softmax; Nq = N, or 1 with ``query``.
        layers: index of each of the L layers among the model's self-attention layers.
        names: hook name of each layer's map.
        layout: prefix tokens and patch grid of the N tokens.
        model_layers: every self-attention map of the model, in forward order (``layers``
            index them; ``num_layers`` counts them).
        patch_size: (ph, pw) image pixels per token (a hierarchical stage's stride).
        image_size: (H, W) of the input.
        query: the token index kept on the query axis, or None for all queries.
        logits: (B, K) model output.
        maps: "softmax" (post-softmax, row-stochastic) or "applied" (what each block multiplies
            with its values: talking-heads mixed or refined maps, which may be signed).
        options: the call's resolved settings (``maps``, ``query``, ``max_bytes``).

    Window attention (Swin, Twins, MaxViT) is held in image space: (B, H, Np, Np) on the stage
    grid, zero outside each query's window (`vizkit.hooks.windows`).
    """

    patterns: Tensor
    layers: list[int]
    names: list[str]
    layout: TokenLayout
    patch_size: tuple[float, float]
    image_size: tuple[int, int]
    model_layers: list[str] = field(repr=False)
    query: int | None = None
    logits: Tensor | None = field(default=None, repr=False)
    maps: str = "softmax"
    options: dict = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return len(self.model_layers)

    def position(self, layer: LayerSpec | None = None) -> int:
        """Position in ``patterns`` of one captured layer, named as for `attention`: an int
        (the model's self-attention layer, negative from its last), a hook name (softmax or
        applied map) or a module path (``"blocks.3"``); None for the deepest captured."""
        if layer is None:
            return self.layers.index(max(self.layers))
        if isinstance(layer, str):
            layer = without_applied_suffix(layer)
        name = select_layer(layer, self.model_layers, what="self-attention layers")
        index = self.model_layers.index(name)
        if index not in self.layers:
            raise ValueError(
                f"Layer {index} ({name}) was not captured (captured: {self.layers}); capture "
                f"it with attention(..., layers=[..., {index}])."
            )
        return self.layers.index(index)

    def heads(self, heads: HeadSpec = "mean") -> Tensor:
        """Patterns with the heads fused by ``heads`` (see `vizkit.hooks.reduce_heads`):
        (L, B, Nq, N)."""
        return reduce_heads(self.patterns, heads)

    def row(
        self, query: str | int | tuple[int, ...] = "cls", heads: HeadSpec | None = None
    ) -> Tensor:
        """Attention of one query token over the patches, on the grid.

        Args:
            query: ``"cls"``, a patch ``(row, col)`` (a video's ``(frame, row, col)``) or a
                token index.
            heads: None keeps the heads; else a reduction as in `heads`.

        Returns:
            (L, B, H, gh, gw), or (L, B, gh, gw) with ``heads``.
        """
        index = query_index(self.layout, query)
        if self.query is None:
            rows = self.patterns[..., index, :]
        elif index == self.query:
            rows = self.patterns[..., 0, :]
        else:
            raise ValueError(
                f"Only query token {self.query} was captured (query=...); capture again with "
                f"query={query!r} or without query for all rows."
            )
        _, patches = self.layout.split(rows, dim=-1)
        grid = self.layout.to_grid(patches)  # (L, B, H, gh, gw)
        return grid if heads is None else reduce_heads(grid, heads, head_dim=2)

    def received(self, heads: HeadSpec = "mean") -> Tensor:
        """Attention each patch receives, averaged over the patch queries (the GMM paper's
        Fig. 7 maps): (L, B, gh, gw), heads fused by ``heads``."""
        if self.query is not None:
            raise ValueError(
                "received() averages over every query; capture without query=... to use it."
            )
        _, patch_queries = self.layout.split(self.patterns, dim=-2)
        _, keys = self.layout.split(patch_queries.mean(-2), dim=-1)  # (L, B, H, Np)
        return reduce_heads(self.layout.to_grid(keys), heads, head_dim=2)

    def stats(self, locality_radius: int = 1) -> dict[str, Tensor]:
        """Per-layer, per-head statistics, each (L, B, H) averaged over the queries.

        ``entropy`` (normalized, 1 = uniform), ``kl_uniform`` (nats), ``diversity`` (mean
        Jensen-Shannon divergence to the other heads, nats); with all queries captured also
        ``distance_patches`` and ``distance_pixels`` (mean attention distance over patch
        queries and keys), ``locality`` (mass within ``locality_radius`` patches) and
        ``self_mass`` (a patch's attention to itself). For a video the distances and the
        locality are within the frame, and ``distance_frames`` adds the mean |Δt| in token
        frames. Average over dims 1 and 2 for per-layer values.

        Applied maps that are not probabilities (refined, mixed) are measured as |A| with rows
        renormalized, and add ``negative_mass`` (share of |A| on negative entries) and
        ``row_sum_deviation`` (|row sum - 1|), both 0 for softmax maps.
        """
        blocks = [[self._head_stats(p, locality_radius) for p in layer] for layer in self.patterns]
        return {
            key: torch.stack([torch.stack([s[key] for s in layer]) for layer in blocks])
            for key in blocks[0][0]
        }

    def _head_stats(self, p: Tensor, locality_radius: int) -> dict[str, Tensor]:
        """`stats` of one image's patterns in one layer (H, Nq, N) -> (H,) each: one block at a
        time bounds the float64 work's memory to a block's, whatever the batch and depth."""
        extra = {}
        if self.maps == "applied":
            extra = {
                "negative_mass": stats.negative_mass(p),
                "row_sum_deviation": stats.row_sum_deviation(p),
            }
            p = stats.absolute_rows(p)
        out = {"entropy": stats.query_entropy(p), "kl_uniform": stats.kl_to_uniform(p)}
        if p.shape[0] > 1:  # heads
            out["diversity"] = stats.head_diversity(p)
        if self.query is None:
            out["distance_patches"] = stats.mean_attention_distance(p, self.layout)
            out["distance_pixels"] = stats.mean_attention_distance(p, self.layout, self.patch_size)
            out["locality"] = stats.locality_mass(p, self.layout, locality_radius)
            out["self_mass"] = stats.self_mass(p, self.layout)
            if self.layout.frames is not None:
                out["distance_frames"] = stats.mean_frame_distance(p, self.layout)
        return {**out, **extra}


def attention_bytes(hm: HookedModel, x: Tensor, names: list[str], query: int | None = None) -> int:
    """Bytes the captured patterns of ``names`` take for batch ``x`` (cast to the model's
    floating dtype, as `check_images` does): sum of B*H*Nq*N*bytes."""
    layout = hm.token_layout(tuple(x.shape[-2:]), names[0])
    n = layout.num_tokens
    heads = sum(_head_count(hm.model.get_submodule(name.rsplit(".", 1)[0])) for name in names)
    weight = next((p for p in hm.model.parameters() if p.is_floating_point()), x)
    return len(x) * heads * (1 if query is not None else n) * n * float_bytes(weight)


def _head_count(attn: nn.Module) -> int:
    """Heads of an attention module (timm ``num_heads``; transformers ``num_attention_heads``
    or its config's, on the module or, before transformers 5.18, its inner self-attention;
    torchvision MaxViT's ``n_heads``; timm Hiera's ``heads``)."""
    for module in attn.modules():
        for owner in (module, getattr(module, "config", None)):
            for name in ("num_heads", "num_attention_heads", "n_heads", "heads"):
                if isinstance(getattr(owner, name, None), int):
                    return getattr(owner, name)
    raise ValueError(f"{type(attn).__name__} does not say how many heads it has.")


@analysis_contract(videos=True)
def attention(
    model: nn.Module | HookedModel,
    x: Tensor,
    layers: LayerSpec | None = None,
    query: str | int | tuple[int, int] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    maps: str = "softmax",
) -> AttentionResult | Stages:
    """Self-attention patterns of ``x`` for ``layers`` (default: all): post-softmax, or the maps
    the blocks apply to their values.

    For CaiT these are the self-attention stage's softmax maps before the talking-heads mix
    (row-stochastic, over patches only); its class attention is `class_attention`.

    Args:
        model: a timm ViT-family model or a HookedModel around one.
        x: image batch (B, C, H, W); moved to the model's device.
        layers: self-attention layers: ints (negative from the end), hook names, globs or
            module paths (``"blocks.3"``), as in `vizkit.hooks.select_layers`.
        query: keep one query row per head (``"cls"``, ``(row, col)`` or a token index):
            (B, H, 1, N) per layer instead of (B, H, N, N).
        max_bytes: refuse captures larger than this (default 4 GiB).
        maps: "softmax" or "applied": per block the map multiplied with the values, i.e. the
            refined map of a `RefinerAttention` (``attn.hook_pattern_refined``), CaiT's mixed
            map, else the softmax map. Refined and mixed maps are not row-stochastic.

    Returns:
        An `AttentionResult` with patterns (L, B, H, Nq, N). By default (``layers=None``,
        ``query=None``) on a model whose layers hold different tokens (the stages of Swin,
        Twins, PiT, MViTv2, MaxViT, LeViT; ConViT's class token joining late): `Stages`, one
        `AttentionResult` per run of layers sharing a layout, from one forward. Layers asked
        for explicitly must share their tokens (`stage_layers` gives one stage's).

    Example:
        >>> import timm, torch
        >>> model = timm.create_model("test_vit").eval()
        >>> result = attention(model, torch.randn(2, 3, 64, 64), layers=[0, "blocks.-1"])
        >>> result.layers, result.names[-1], tuple(result.patterns.shape)
        ([0, 5], 'blocks.5.attn.hook_pattern', (2, 2, 2, 17, 17))

    Raises:
        ValueError: a model without self-attention, a layer or query out of range, or a capture
            above ``max_bytes`` (the message gives its size and how to shrink it).
    """
    hm = as_hooked(model)
    check_image_batch(hm.model, x)  # the size check below reads no values; check_images does
    check_choice("maps", maps, ("softmax", "applied"))
    max_bytes = check_count("max_bytes", max_bytes)
    names = (attention_names if maps == "softmax" else applied_attention_names)(hm, layers)
    image_size = tuple(x.shape[-2:])
    groups = layout_runs(hm, names, image_size)
    if len(groups) > 1 and (layers is not None or query is not None):
        common_layout(hm, names, image_size)  # refuses: explicit layers must share their tokens
    layouts = [hm.token_layout(image_size, group[0]) for group in groups]
    layout_of = {name: lay for group, lay in zip(groups, layouts, strict=True) for name in group}
    row = None if query is None else query_index(layouts[0], query)
    size = sum(attention_bytes(hm, x, group, row) for group in groups)
    if size > max_bytes:
        raise ValueError(
            f"Capturing {len(names)} attention layers for a batch of {len(x)} would take "
            f"{size / 2**20:.1f} MiB (B x H x Nq x N floats per layer), above "
            f"max_bytes={max_bytes / 2**20:.1f} MiB. Pass layers=[...] for a subset, "
            "query='cls' (one row per head), a smaller batch, or a larger max_bytes."
        )
    x = check_images(hm.model, x)
    captured: dict[str, Tensor] = {}

    def keep(pattern: Tensor, *, name: str) -> None:
        layout = layout_of[name]
        pattern = grid_map(hm, name, pattern, layout)
        if pattern.shape[-1] != layout.num_tokens:
            raise ValueError(
                f"{name} has {pattern.shape[-1]} keys but the token layout says "
                f"{layout.num_tokens} ({layout.num_prefix_tokens} prefix + "
                f"{'x'.join(map(str, layout.cells))} patches): vizkit has this model's token "
                "grid wrong. Please report it; read the map as captured with run_with_cache "
                "meanwhile."
            )
        check_values_finite(f"The attention maps of {name}", pattern)
        captured[name] = (pattern if row is None else pattern[:, :, row : row + 1]).clone()

    with torch.no_grad(), hm.hooks(fwd={name: keep for name in names}, read_only=True):
        logits = hm(x)
    options = {"maps": maps, "query": row, "max_bytes": max_bytes}
    results = [
        AttentionResult(
            patterns=torch.stack([captured[name] for name in group]),
            layers=[layer_index(hm, name) for name in group],
            names=group,
            layout=layout,
            patch_size=token_pixels(layout, image_size),
            image_size=image_size,
            model_layers=attention_names(hm),
            query=row,
            logits=logits,
            maps=maps,
            options=options,
        )
        for group, layout in zip(groups, layouts, strict=True)
    ]
    return results[0] if len(results) == 1 else Stages(results, image_size, options)


def _span(ids: list[int]) -> str:
    if len(ids) == 1:
        return f"layer {ids[0]}"
    contiguous = ids == list(range(ids[0], ids[-1] + 1))
    return f"layers {ids[0]}..{ids[-1]}" if contiguous else f"layers {ids}"


def stage_layers(
    model: nn.Module | HookedModel, image_size: tuple[int, int], layer: LayerSpec = -1
) -> list[int]:
    """Indices of the self-attention layers over the same tokens as ``layer`` (default: the
    last stage of a hierarchical model; every layer of a plain ViT), for `attention(layers=)`.
    ``layer`` may also name a stage (Swin's ``"layers.2"``)."""
    hm = as_hooked(model)
    names = attention_names(hm)
    chosen = attention_names(hm, layer)
    target = common_layout(hm, chosen, image_size, fix="Name one layer or one stage.")
    return [i for i, n in enumerate(names) if hm.token_layout(image_size, n) == target]


def common_layout(
    hm: HookedModel, names: list[str], image_size: tuple[int, int], fix: str = ""
) -> TokenLayout:
    """The one token layout of the maps ``names``; a ValueError if they differ (stages of a
    hierarchical model, a class token that joins late), naming the layers that do agree and
    ending with ``fix`` (default: pick layers of one group)."""
    layouts = {name: hm.token_layout(image_size, name) for name in names}
    layout = layouts[names[0]]
    if all(other == layout for other in layouts.values()):
        return layout
    groups: dict[TokenLayout, list[int]] = {}
    for name, lay in layouts.items():
        groups.setdefault(lay, []).append(layer_index(hm, name))
    described = "; ".join(
        f"{_span(ids)}: {lay.num_prefix_tokens} prefix + {'x'.join(map(str, lay.cells))} patches"
        for lay, ids in groups.items()
    )
    raise ValueError(
        f"The chosen layers hold different tokens ({described}), e.g. the stages of a "
        "hierarchical model or a class token that joins late, so their maps cannot be stacked. "
        + (fix or "Pass layers=[...] from one group.")
    )
