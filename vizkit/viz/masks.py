"""Learned attention masks: the N x N mask and one query's kernel on the patch grid."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

from ._style import MASK_SCALE, finish

__all__ = ["mask_figure"]


def mask_figure(
    mask: Tensor, grid: tuple[int, int], query: tuple[int, int] | None = None, title: str = ""
) -> go.Figure:
    """A patch-to-patch mask (Np, Np) as a heatmap (left) and the row of one query patch
    reshaped onto the (gh, gw) grid (right; default the centre patch).

    Args:
        mask: (Np, Np) over the patch tokens, row = query, column = key.
        grid: (gh, gw) with gh * gw = Np.
    """
    gh, gw = grid
    if mask.ndim != 2 or mask.shape != (gh * gw, gh * gw):
        raise ValueError(
            f"mask must be (Np, Np) = ({gh * gw}, {gh * gw}) for a {gh}x{gw} grid; got "
            f"{tuple(mask.shape)}."
        )
    r, c = query if query is not None else (gh // 2, gw // 2)
    if not (0 <= r < gh and 0 <= c < gw):
        raise ValueError(f"query {query} is outside the {gh}x{gw} grid.")
    values = mask.detach().float().cpu()
    kernel = values[r * gw + c].reshape(gh, gw)
    titles = ["mask M (query patch x key patch)", f"row of query patch ({r}, {c}) on the grid"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles)
    fig.add_trace(go.Heatmap(z=values.numpy(), coloraxis="coloraxis"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=kernel.numpy(), coloraxis="coloraxis"), row=1, col=2)
    fig.add_trace(
        go.Scatter(x=[c], y=[r], mode="markers", marker={"symbol": "x", "color": "black"},
                   name="query", showlegend=False),
        row=1, col=2,
    )  # fmt: skip
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(coloraxis={"colorscale": MASK_SCALE, "cmid": 0})
    return finish(fig, title or "Learned attention mask", 430)
