"""AttentionExplorer: pick an image, a view, a layer and a head; click a patch for its row."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go
from torch import Tensor, nn

from .. import analysis
from ..hooks import HookedModel, reduce_heads
from ..hooks.inputs import check_images
from ..methods.class_attention import class_attention
from ..methods.rollout import rollout
from ..viz import display_images
from ..viz.attention import default_query, outline_patch, query_label, weight_range
from ..viz.overlay import heatmap_on_image
from ..viz.style import ATTENTION_SCALE, SALIENCY_SCALE, finish, map_axes
from .explorer import Explorer

__all__ = ["AttentionExplorer"]

VIEWS = ("query row", "class attention", "rollout")
REDUCTIONS = ("mean", "max", "min")
CLICK_HINT = "<br><sup>click a patch to make it the query</sup>"
UNUSED_CONTROLS_HINT = "<br><sup>layer and head do not apply</sup>"


class AttentionExplorer(Explorer):
    """Attention of a ViT-family model, interactively.

    Views: "query row" (the attention of the chosen query over the patches, at the chosen
    layer and head; click a patch to make it the query), "class attention" (CaiT's class
    token, or the ViT CLS row of the last layer), "rollout". Each analysis runs once per image
    and is cached; moving a slider only redraws.

    Args:
        model: a ViT-family model (timm VisionTransformer, Cait, vizkit models).
        images: (B, C, H, W) normalized for the model.
        mean, std: to show the images (default: the model's data config).
    """

    CONTROL_HINTS = (CLICK_HINT, UNUSED_CONTROLS_HINT)

    def __init__(
        self,
        model: nn.Module,
        images: Tensor,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.model, self.images = model, check_images(model, images)
        self.display = display_images(images, model, mean, std)
        depth = len(analysis.self_attention_names(HookedModel(model)))
        first = self._attention(0, depth - 1)  # raises for models without self-attention
        self.query: str | tuple[int, int] = default_query(first)
        self._query_grid = first.layout.grid  # the grid a patch query was chosen on
        heads = first.patterns.shape[2]
        self.image = widgets.IntSlider(0, 0, len(images) - 1, description="image")
        self.view = widgets.ToggleButtons(options=VIEWS, description="view")
        self.layer = widgets.IntSlider(depth - 1, 0, depth - 1, description="layer")
        self.head = widgets.Dropdown(
            options=[*REDUCTIONS, *range(heads)], value="mean", description="head"
        )
        self.controls = [self.image, self.layer, self.head, self.view]
        self._observe(*self.controls)
        self.refresh()

    def select(self, query: str | tuple[int, int]) -> None:
        """Make ``query`` ("cls" or a patch (row, col)) the query of the "query row" view."""
        self.query = query
        self._query_grid = self._attention(self.image.value, self.layer.value).layout.grid
        self.refresh()

    def _query_on(self, layout) -> str | tuple[int, int]:
        """The query on ``layout``'s grid: a patch is moved to the same place of another stage's
        grid; the class token falls back to the centre patch where there is none."""
        if self.query == "cls":
            return "cls" if layout.class_token else (layout.grid[0] // 2, layout.grid[1] // 2)
        (row, col), (gh, gw), (qh, qw) = self.query, layout.grid, self._query_grid
        return (row * gh // qh, col * gw // qw)

    def _attention(self, image: int, layer: int) -> analysis.AttentionResult:
        """One layer's maps of one image (layers of a hierarchical model differ in grid)."""
        return self.cached(
            ("attention", image, layer),
            lambda: analysis.attention(self.model, self.images[image : image + 1], layers=layer),
        )

    def _figure(self) -> go.Figure:
        i, view = self.image.value, self.view.value
        if view == "query row":
            result = self._attention(i, self.layer.value)
            query = self._query_on(result.layout)
            rows = result.row(query)[0, 0]  # (H, gh, gw)
            head = self.head.value
            values = rows[head] if isinstance(head, int) else reduce_heads(rows, head, head_dim=0)
            title = (
                f"Attention of {query_label(query)} at layer {result.layers[0]}, head {head}"
                + CLICK_HINT
            )
            scale, value, zrange = ATTENTION_SCALE, "weight", weight_range(values)
        else:
            saliency = self._saliency(view, i)
            values, scale, value, zrange = saliency.maps[0], SALIENCY_SCALE, view, None
            title = f"{view} of image {i}{UNUSED_CONTROLS_HINT}"
        fig = go.Figure(heatmap_on_image(self.display[i], values, colorscale=scale, value=value,
                                         zrange=zrange))  # fmt: skip
        if view == "query row" and query != "cls":
            outline_patch(fig, query, result.layout.grid, self.display.shape[1:3])
        map_axes(fig)
        return finish(fig, title, 520)

    def _connect_clicks(self) -> None:
        self.figure.data[1].on_click(self._clicked)  # the map

    def _inapplicable(self) -> set[widgets.Widget]:
        return set() if self.view.value == "query row" else {self.layer, self.head}

    def _saliency(self, view: str, image: int):
        x = self.images[image : image + 1]
        if view == "rollout":
            compute = lambda: rollout(self.model, x, allow_non_stochastic=True)  # noqa: E731
        else:
            compute = lambda: class_attention(self.model, x)  # noqa: E731
        return self.cached((view, image), compute)

    def _clicked(self, trace, points, state) -> None:
        if not points.xs:
            return
        row, col = points.ys[0], points.xs[0]  # pixel coordinates of the clicked cell
        gh, gw = self._attention(self.image.value, self.layer.value).layout.grid
        height, width = self.display.shape[1:3]
        self.select((int(row * gh // height), int(col * gw // width)))
