"""Figures of the model-parameter randomization tests (`vizkit.metrics.sanity_check`): one
image's maps per randomized layer, and each method's similarity to its trained maps per step
(Adebayo et al. 2018, Fig. 2 and 4)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ..metrics.sanity import SanityResult
from .overlay import opacity_slider, overlay_grid
from .saliency import check_display
from .style import MIN_FONT_SIZE, finish, method_color

__all__ = ["sanity_curves", "sanity_maps"]

PER_ROW = 5


def _step_label(result: SanityResult, step: int) -> str:
    layer = result.layers[step] or "own parameters"
    return f"up to {layer}" if result.mode == "cascading" else layer  # independent, data


def sanity_maps(
    result: SanityResult, images: np.ndarray, image: int = 0, per_row: int = PER_ROW
) -> go.Figure:
    """Image ``image``'s map of the trained model, then after each randomization step (each
    min-max scaled), ``per_row`` to a row; each title names the layers randomized and the
    Spearman correlation (of absolute values) with the trained map."""
    check_display(result.original, images, image)
    maps = [result.original[image], *result.maps[:, image]]
    rho = result.similarity["spearman_abs"][:, image].tolist()
    titles = ["trained"] + [  # a no-break space: a narrow figure's wrap keeps ρ with its value
        f"{_step_label(result, s)}<br>ρ\u00a0{rho[s]:.2f}" for s in range(len(result.layers))
    ]
    cells = [(images[image], m) for m in maps]
    rows = [cells[i : i + per_row] for i in range(0, len(cells), per_row)]
    fig = overlay_grid(rows, subplot_titles=titles, horizontal_spacing=0.02,
                       vertical_spacing=0.25 / len(rows))  # fmt: skip
    fig.update_annotations(font_size=MIN_FONT_SIZE)
    opacity_slider(fig)
    title = (
        f"{result.method}: image {image}'s map as the model is randomized ({result.mode}, "
        "top layer first; ρ: Spearman of |map| with the trained one)"
    )
    return finish(fig, title, 330 * len(rows) + 120)


def sanity_curves(results: Sequence[SanityResult], similarity: str = "spearman_abs") -> go.Figure:
    """Each result's (method's) mean ``similarity`` to its trained maps per randomization step,
    with the standard error over the images as error bars; the x axis names the layers, top
    first."""
    if not results:
        raise ValueError("results is empty; pass the SanityResults of one or more methods.")
    if len({tuple(r.layers) for r in results}) > 1 or len({r.mode for r in results}) > 1:
        raise ValueError("The results randomize different layers or modes; compare like runs.")
    if similarity not in results[0].similarity:
        raise ValueError(
            f"similarity must be one of {sorted(results[0].similarity)}; got {similarity!r}."
        )
    labels = [_step_label(results[0], s) for s in range(len(results[0].layers))]
    fig = go.Figure()
    for result in results:
        values = result.similarity[similarity]  # (S, B)
        mean = values.nanmean(1).tolist()
        count = (~values.isnan()).sum(1).clamp_min(1)
        spread = (values - values.nanmean(1, keepdim=True)).nan_to_num().pow(2).sum(1)
        error = (spread / (count - 1).clamp_min(1)).sqrt() / count.sqrt()
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=mean,
                mode="lines+markers",
                name=result.method,
                line={"color": method_color(result.method)},
                error_y={"type": "data", "array": error.tolist()},
            )  # fmt: skip
        )
    fig.add_hline(y=0, line={"color": "grey", "width": 1})
    fig.update_yaxes(title=similarity.replace("_", " "), range=[-1.05, 1.05])
    fig.update_xaxes(title=f"randomized ({results[0].mode}), top layer first")
    title = (
        f"Sanity check: each method's similarity to its maps of the trained model<br>"
        f"({results[0].mode} randomization; error bars: standard error over the images)"
    )
    return finish(fig, title, 450)
