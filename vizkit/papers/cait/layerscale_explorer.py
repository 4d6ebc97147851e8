"""LayerScaleExplorer: how LayerScale's initial ε scales each block's change at initialisation
(CaiT Eq. 4), with the plain pre-norm residual (ε = 1) as the reference."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from torch import Tensor

from ...analysis import residual_ratios
from ...hooks.inputs import check_count, check_images, check_number
from ...viz.style import finish, log_axis
from ...widgets.explorer import Explorer
from .cait_variants import residual_vit

__all__ = ["LayerScaleExplorer"]

EPS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0)


class LayerScaleExplorer(Explorer):
    """A freshly initialised tiny ViT with LayerScale ε (slider), the same weights otherwise:
    residual-norm ratio per layer with LayerScale, which is exactly ε x its unscaled ratio at
    init, beside the plain pre-norm residual (which ε = 1 reproduces exactly).

    Args:
        images: (B, 3, 32, 32) batch for the ratios; depth: blocks of the tiny ViT.
    """

    def __init__(self, images: Tensor, depth: int = 12, eps: Sequence[float] = EPS) -> None:
        super().__init__()
        self.depth = check_count("depth", depth)
        if len(eps) < 2:
            raise ValueError(f"eps must hold at least 2 values for the slider; got {eps!r}.")
        eps = [check_number("eps", e, 0, low_open=True) for e in eps]
        self.images = check_images(residual_vit(depth=depth), images)
        self.eps = widgets.SelectionSlider(
            options=[(f"{e:g}", e) for e in eps], value=eps[-2], description="ε"
        )
        self.branch = widgets.ToggleButtons(options=["attn", "mlp"], description="branch")
        self.controls = [self.eps, self.branch]
        self._observe(*self.controls)
        self.refresh()

    def ratios(self, eps: float):
        """Residual ratios of the tiny ViT with LayerScale ``eps`` (seed 0, computed once)."""

        def compute():
            torch.manual_seed(0)
            return residual_ratios(
                residual_vit("layerscale", eps=eps, depth=self.depth), self.images
            )

        return self.cached(eps, compute)

    def _figure(self) -> go.Figure:
        eps, branch = self.eps.value, self.branch.value
        scaled, plain = self.ratios(eps), self.ratios(1.0)  # ε = 1 is the plain residual
        layers = list(range(1, self.depth + 1))
        unscaled = getattr(scaled, f"{branch}_unscaled")
        fig = go.Figure(
            [
                go.Scatter(x=layers, y=getattr(plain, branch).tolist(), mode="lines+markers",
                           name="plain pre-norm residual (= LayerScale ε = 1)"),
                go.Scatter(x=layers, y=getattr(scaled, branch).tolist(), mode="lines+markers",
                           name=f"LayerScale ε = {eps:g}"),
                go.Scatter(x=layers, y=(eps * unscaled).tolist(), mode="lines",
                           line={"dash": "dot", "color": "black"},
                           name="ε x its unscaled ratio (equal at init)"),
            ]
        )  # fmt: skip
        log_axis(fig, "y", title_text="‖branch‖ / ‖x‖ at initialisation")
        fig.update_xaxes(title_text="block", dtick=1)
        return finish(fig, f"LayerScale at init: the {branch} branch is scaled by ε = {eps:g}", 420)
