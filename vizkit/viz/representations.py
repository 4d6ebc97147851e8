"""Representation figures: CKA heatmap, feature-evolution curves, residual-norm ratios (CaiT
Fig. 4), LayerScale heatmap."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..analysis import CKAResult, FeatureEvolution, LayerScale, ResidualRatios
from .style import CKA_SCALE, epoch_shades, finish, layer_label, palette, square_cells

__all__ = ["cka_heatmap", "feature_evolution_curves", "layerscale_heatmap", "residual_ratio_curves"]


def cka_heatmap(result: CKAResult, title: str | None = None) -> go.Figure:
    """The layer x layer CKA matrix (rows: model a's layers, columns: model b's)."""
    o = result.options
    fig = go.Figure(
        go.Heatmap(
            z=result.matrix.numpy(),
            x=[layer_label(n) for n in result.layers_b],
            y=[layer_label(n) for n in result.layers_a],
            colorscale=CKA_SCALE,
            zmin=0,
            zmax=1,
            colorbar={"title": "CKA"},
            hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    square_cells(fig)
    estimator = "unbiased" if o.get("unbiased") else "biased"
    models = (
        f"{o.get('model_a')} (rows) vs {o.get('model_b')} (columns)"
        if o.get("model_b")
        else f"{o.get('model_a')}, its layers against each other"
    )
    default = (
        f"{o.get('kernel', 'linear')} CKA ({estimator} HSIC, tokens {o.get('tokens')}, "
        f"{o.get('examples')} images): {models}"
    )
    return finish(fig, title or default, 520)


def feature_evolution_curves(curves: Mapping[str, FeatureEvolution]) -> go.Figure:
    """Refiner Eq. 2 curves of several models against normalized depth k / L (left), and the
    CKA of each block with the first block (right)."""
    if not curves:
        raise ValueError("curves is empty; pass {label: feature_evolution(model, data)}.")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12)
    for i, (label, evo) in enumerate(curves.items()):
        color = palette(i)
        for col, values in ((1, evo.curve), (2, evo.vs_first)):
            fig.add_trace(
                go.Scatter(
                    x=evo.depth.tolist(), y=values.tolist(), mode="lines+markers", name=label,
                    legendgroup=label, showlegend=col == 1, line={"color": color},
                    text=[layer_label(n) for n in evo.layers],
                    hovertemplate="%{text}: %{y:.3f}<extra>" + label + "</extra>",
                ),
                row=1, col=col,
            )  # fmt: skip
    fig.update_xaxes(title_text="normalized depth k / L")
    fig.update_yaxes(title_text="F_k = CKA(f_k, f_out) / CKA(f_in, f_out)", row=1, col=1)
    fig.update_yaxes(title_text="CKA(f_k, f_in)", row=1, col=2)
    title = (
        "Feature evolution over depth (Refiner, Eq. 2 and Fig. 2/4)<br><sup>left: each block's "
        "similarity to the output, relative to the input's; right: its similarity to the "
        "input</sup>"
    )
    return finish(fig, title, 440)


def residual_ratio_curves(
    ratios: ResidualRatios | Sequence[ResidualRatios] | Mapping[str, ResidualRatios],
    scaled: bool = True,
) -> go.Figure:
    """CaiT Fig. 4: ||branch|| / ||stream entering it|| per layer, self-attention (top) and FFN
    (bottom).

    Args:
        ratios: one result; a sequence of them, one per epoch (a tracked history's
            ``residual_ratios`` entries, `vizkit.train.tracked_results`: one curve per epoch,
            darker = later); or a mapping ``{label: result}`` to compare models (one colour
            each, labelled).
        scaled: the branch as added (after LayerScale's diag(λ), where the model has it), or
            without λ (the same curve for a model without LayerScale).
    """
    if isinstance(ratios, Mapping):
        labels, series = list(ratios), list(ratios.values())
        colors = [palette(i) for i in range(len(series))]
    else:
        series = [ratios] if isinstance(ratios, ResidualRatios) else list(ratios)
        labels = [f"epoch {i + 1}" for i in range(len(series))] if len(series) > 1 else ["ratio"]
        colors = epoch_shades(len(series)) if len(series) > 1 else [palette(0)]
    if not series:
        raise ValueError("No residual ratios to plot.")
    for entry in series:
        if not isinstance(entry, ResidualRatios):
            raise TypeError(
                f"Expected ResidualRatios results; got a {type(entry).__name__}. A training "
                "history's entries are read back with vizkit.train.tracked_results(history, "
                "'residual_ratios') (or ResidualRatios.from_dict)."
            )
    suffix = "" if scaled else "_unscaled"
    what = _layerscale_words(series, scaled)
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
        subplot_titles=[f"self-attention branch{what}", f"FFN branch{what}"],
    )  # fmt: skip
    for label, color, entry in zip(labels, colors, series, strict=True):
        for row, key in ((1, "attn"), (2, "mlp")):
            fig.add_trace(
                go.Scatter(
                    x=entry.layers, y=getattr(entry, key + suffix).tolist(),
                    mode="lines+markers", name=label, legendgroup=label, showlegend=row == 1,
                    line={"color": color},
                    hovertemplate="%{x}: %{y:.3g}<extra>" + label + "</extra>",
                ),
                row=row, col=1,
            )  # fmt: skip
    class_stage = any("token_only" in layer for entry in series for layer in entry.layers)
    axis = "block (blocks_token_only: the class-attention stage)" if class_stage else "block"
    fig.update_xaxes(title_text=axis, row=2, col=1)
    fig.update_yaxes(title_text="‖branch‖ / ‖x‖")
    fig.update_layout(showlegend=len(series) > 1)  # one curve: nothing to tell apart
    reduction = series[-1].reduction
    return finish(fig, f"Residual-norm ratios per layer (CaiT Fig. 4; reduction {reduction})", 560)


def _layerscale_words(series: list[ResidualRatios], scaled: bool) -> str:
    """What the curves show about LayerScale, from the results themselves."""
    flags = [any(entry.has_layerscale) for entry in series]
    if not any(flags):
        return " (no LayerScale)"
    mixed = "" if all(flags) else " where the model has it"
    return f", with LayerScale{mixed}" if scaled else ", without LayerScale's λ (unscaled)"


def layerscale_heatmap(values: LayerScale) -> go.Figure:
    """LayerScale λ per layer and channel (`vizkit.analysis.layerscale`), attention (left) and
    FFN (right) branches; 1 for blocks without LayerScale."""
    blocks = values.layers
    fig = make_subplots(
        rows=1,
        cols=2,
        shared_yaxes=True,
        horizontal_spacing=0.03,
        subplot_titles=["λ of the attention branch", "λ of the FFN branch"],
    )  # fmt: skip (one set of block names, left)
    for col, rows in enumerate((values.attn, values.mlp)):
        width = max(len(r) for r in rows if r is not None)
        z = torch.stack([r.float() if r is not None else torch.ones(width) for r in rows])
        fig.add_trace(
            go.Heatmap(
                z=z.numpy(), y=blocks, coloraxis="coloraxis",
                hovertemplate="%{y}, channel %{x}: %{z:.3g}<extra></extra>",
            ),
            row=1, col=col + 1,
        )  # fmt: skip
    fig.update_xaxes(title_text="channel")
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_layout(coloraxis={"colorscale": "RdBu_r", "cmid": 0, "colorbar": {"title": "λ"}})
    return finish(
        fig, "LayerScale diag(λ) per layer and channel (CaiT Eq. 1)", 120 + 28 * len(blocks)
    )
