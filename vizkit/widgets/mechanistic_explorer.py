"""MechanisticExplorer: which heads decide, and from which depth the class is decodable."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor, nn

from .. import analysis
from ..hooks import HookedModel
from ..hooks.inputs import check_images
from ..viz import display_images
from ..viz.attention import default_query, query_label, weight_range
from ..viz.mechanistic import DIVERGING, logit_lens_maps
from ..viz.overlay import heatmap_on_image
from ..viz.style import ATTENTION_SCALE, finish
from .explorer import Explorer

__all__ = ["MechanisticExplorer"]

VIEWS = ("heads", "logit lens")
CLICK_HINT = "<br><sup>click a head in either grid to see its attention</sup>"


class MechanisticExplorer(Explorer):
    """The mechanistic views of one image at a time.

    "heads": two layer x head grids, each head's direct contribution to the explained logit
    (`vizkit.direct_logit_attribution`) and the share of the clean logit restored by patching
    its output into the run on the corrupted image (`vizkit.activation_patching`); click a
    head in either to see its attention (the class token's row, or the mean row without one)
    beside them. "logit lens": the head read off each patch after the chosen layer
    (`vizkit.logit_lens`). Each analysis runs once per image and is cached.

    Args:
        model: a transformer whose blocks name a residual stream (docs/coverage.md).
        images: (B, C, H, W) normalized for the model.
        corrupted: (B, C, H, W) the images to patch into; default: the images with Gaussian
            noise of standard deviation 1 (in normalized units, seed 0).
        classes: class names for the titles; mean, std: to show the images.
    """

    CONTROL_HINTS = (CLICK_HINT,)

    def __init__(
        self,
        model: nn.Module,
        images: Tensor,
        corrupted: Tensor | None = None,
        classes: Sequence[str] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.model, self.images = model, check_images(model, images)
        if corrupted is None:
            noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(0))
            corrupted = self.images + noise.to(self.images)
        self.corrupted = check_images(model, corrupted)
        if self.corrupted.shape != self.images.shape:
            raise ValueError(
                f"corrupted must match images {tuple(images.shape)}; got "
                f"{tuple(self.corrupted.shape)}."
            )
        self.classes = classes
        self.display = display_images(images, model, mean, std)
        first = self.attribution(0)  # raises for models without a residual stream
        if first.heads is None:
            raise ValueError(f"The heads of this model do not split: {first.notes['heads']}")
        depth, heads = first.heads.shape[1:]
        self.blocks = first.blocks
        self.image = widgets.IntSlider(0, 0, len(images) - 1, description="image")
        self.view = widgets.ToggleButtons(options=VIEWS, description="view")
        self.layer = widgets.IntSlider(depth - 1, 0, depth - 1, description="layer")
        self.head = widgets.IntSlider(0, 0, heads - 1, description="head")
        self.controls = [self.image, self.layer, self.head, self.view]
        self._observe(*self.controls)
        self.refresh()

    def _connect_clicks(self) -> None:
        """A click on either grid chooses the head."""
        if self.view.value == "heads":
            for trace in self.figure.data[:2]:
                trace.on_click(self._clicked)

    def attribution(self, image: int) -> analysis.LogitAttribution:
        x = self.images[image : image + 1]
        return self.cached(("dla", image),
                           lambda: analysis.direct_logit_attribution(self.model, x))  # fmt: skip

    def patching(self, image: int) -> analysis.PatchingResult:
        pair = self.images[image : image + 1], self.corrupted[image : image + 1]
        return self.cached(("patching", image), lambda: analysis.activation_patching(
            self.model, *pair, sites=("heads",), progress=False))  # fmt: skip

    def lens(self, image: int) -> analysis.LogitLens:
        x = self.images[image : image + 1]
        return self.cached(("lens", image), lambda: analysis.logit_lens(self.model, x))

    def attention(self, image: int, layer: int) -> analysis.AttentionResult:
        x = self.images[image : image + 1]
        return self.cached(("attention", image, layer), lambda: analysis.attention(
            self.model, x, layers=layer))  # fmt: skip

    def _figure(self) -> go.Figure:
        i = self.image.value
        if self.view.value == "logit lens":
            lens = self.lens(i)
            return logit_lens_maps(lens, self.display[i : i + 1], 0, classes=self.classes,
                                   layer=self.layer.value + 1)  # fmt: skip
        dla, patched = self.attribution(i), self.patching(i)
        layer, head = self.layer.value, self.head.value
        titles = [
            "direct contribution",
            "restored by patching",
            f"{self.blocks[layer]} head {head}",
        ]
        fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, subplot_titles=titles)
        for col, (grid, bar) in enumerate(
            ((dla.heads[0], "direct contribution"), (patched.heads[0], "restored share")),
            start=1,
        ):
            values = grid.cpu().numpy()
            top = max(float(abs(values).max()), 1e-12)
            fig.add_trace(go.Heatmap(
                z=values, x=[f"head {h}" for h in range(values.shape[1])], y=self.blocks,
                colorscale=DIVERGING, zmid=0, zmin=-top, zmax=top,
                colorbar={"title": {"text": bar, "side": "top"}, "orientation": "h",
                          "y": -0.22, "yanchor": "top", "len": 0.28, "thickness": 12,
                          "x": sum(fig.layout[f"xaxis{col if col > 1 else ''}"].domain) / 2},
                hovertemplate="%{y}, %{x}: %{z:.3f}<extra></extra>",
            ), row=1, col=col)  # fmt: skip
            fig.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=layer - 0.5,
                          y1=layer + 0.5, line={"color": "black", "width": 3},
                          row=1, col=col)  # fmt: skip
            fig.update_yaxes(autorange="reversed", scaleanchor=f"x{col if col > 1 else ''}",
                             constrain="domain", row=1, col=col)  # fmt: skip
            fig.update_xaxes(constrain="domain", row=1, col=col)
        attention = self.attention(i, self._self_attention_index(layer))
        query = default_query(attention)
        row = attention.row(query)[0, 0, head]  # (gh, gw)
        for trace in heatmap_on_image(self.display[i], row, colorscale=ATTENTION_SCALE,
                                      value="weight", colorbar=False,
                                      zrange=weight_range(row)):  # fmt: skip
            fig.add_trace(trace, row=1, col=3)
        fig.update_xaxes(showticklabels=False, row=1, col=3)
        fig.update_yaxes(showticklabels=False, autorange="reversed", scaleanchor="x3",
                         constrain="domain", row=1, col=3)  # fmt: skip
        contribution = float(dla.heads[0, layer, head])
        restored = float(patched.heads[0, layer, head])
        title = (
            f"Heads of image {i}: {self.blocks[layer]} head {head} adds {contribution:.3f} "
            f"directly; patching it restores {restored:.2f} of the clean logit; its attention of "
            f"{query_label(query)}" + CLICK_HINT
        )
        return finish(fig, title, 470)

    def _self_attention_index(self, layer: int) -> int:
        """The index among the model's self-attention maps of the map in block ``layer``."""
        names = analysis.self_attention_names(HookedModel(self.model))
        block = self.blocks[layer]
        return next(i for i, n in enumerate(names) if n.startswith(f"{block}."))

    def _inapplicable(self) -> set[widgets.Widget]:
        return {self.head} if self.view.value == "logit lens" else set()

    def _clicked(self, trace, points, state) -> None:
        if not points.ys:
            return
        layer = self.blocks.index(points.ys[0])
        head = int(str(points.xs[0]).removeprefix("head "))
        self.layer.value, self.head.value = layer, head  # each change redraws
