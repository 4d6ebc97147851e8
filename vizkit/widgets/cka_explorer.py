"""CKAExplorer: pick one of several CKA results (models, epochs) for the heatmap; all of their
feature-evolution curves on one plot."""

from __future__ import annotations

from collections.abc import Mapping

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..analysis import CKAResult, FeatureEvolution
from ..viz import cka_heatmap
from ..viz.fit import COLORBAR_PX
from ..viz.style import finish, square_cells
from .explorer import Explorer
from .redraw import PLOTLY_WIDTH

__all__ = ["CKAExplorer"]


class CKAExplorer(Explorer):
    """Heatmap of the chosen result beside the feature-evolution curves of all of them (the
    chosen one bold).

    Args:
        results: label -> `FeatureEvolution` (from `feature_evolution`) or `CKAResult` (a
            square within-model matrix; the curve is read from it as Eq. 2 does).
    """

    def __init__(self, results: Mapping[str, CKAResult | FeatureEvolution]) -> None:
        super().__init__()
        if not results:
            raise ValueError(
                "results is empty; pass {label: feature_evolution(...) or cka_matrix(...)}."
            )
        self.results = {label: _as_cka(label, r) for label, r in results.items()}
        self.choice = widgets.Dropdown(options=list(self.results), description="result")
        self.controls = [self.choice]
        self._observe(self.choice)
        self.refresh()

    def _figure(self) -> go.Figure:
        chosen = self.choice.value
        heat = cka_heatmap(self.results[chosen])
        # between the two: room for the curves' ticks and axis title (90 px) at any width
        plot = (self._plot.width or PLOTLY_WIDTH) - 70 - COLORBAR_PX
        fig = make_subplots(
            rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=max(0.1, 90 / plot),
            subplot_titles=[f"CKA of {chosen}", "F_k = CKA(f_k, f_out) / CKA(f_in, f_out)"],
        )  # fmt: skip
        fig.add_trace(heat.data[0], row=1, col=1)
        for label, result in self.results.items():
            matrix = result.matrix
            if matrix.shape[0] != matrix.shape[1]:
                continue  # across two models: no evolution curve
            curve = (matrix[:, -1] / matrix[0, -1]).tolist()
            depth = [(k + 1) / len(curve) for k in range(len(curve))]
            bold = label == chosen
            fig.add_trace(
                go.Scatter(x=depth, y=curve, name=label, mode="lines+markers",
                           line={"width": 4 if bold else 1.5}, opacity=1 if bold else 0.5),
                row=1, col=2,
            )  # fmt: skip
        fig.update_yaxes(autorange="reversed", row=1, col=1)
        square_cells(fig)
        fig.update_xaxes(title_text="normalized depth k / L", row=1, col=2)
        fig.update_yaxes(title_text="F_k (feature evolution)", row=1, col=2)
        finish(fig, f"CKA explorer: {chosen}", 560)
        # the legend under the curves, so that the heatmap's colour bar at the right has the
        # figure's edge to itself
        legend = {"orientation": "h", "x": 0.55, "y": -0.2, "yanchor": "top"}
        return fig.update_layout(legend=legend, margin_b=110)


def _as_cka(label: str, result: CKAResult | FeatureEvolution) -> CKAResult:
    if isinstance(result, FeatureEvolution):
        return result.cka
    if isinstance(result, CKAResult):
        return result
    raise TypeError(
        f"{label!r}: expected a CKAResult or FeatureEvolution; got {type(result).__name__}."
    )
