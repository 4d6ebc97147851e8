"""AttentionExplorer: pick an image, a view, a layer and a head; click a patch for its row. On a
video model: pick a clip and a frame too; a patch is a (frame, row, col) token."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import plotly.graph_objects as go
from torch import Tensor, nn

from .. import analysis
from ..hooks import HookedModel, reduce_heads
from ..hooks.inputs import check_images, video_input
from ..hooks.video import running
from ..methods.class_attention import class_attention
from ..methods.rollout import rollout
from ..viz import display_images
from ..viz.attention import centre_patch, default_query, outline_patch, query_label, weight_range
from ..viz.overlay import heatmap_on_image
from ..viz.style import ATTENTION_SCALE, SALIENCY_SCALE, finish, map_axes
from ..viz.video import clip_cell, clip_grid, map_frame
from .explorer import Explorer

__all__ = ["AttentionExplorer"]

VIEWS = ("query row", "class attention", "rollout")
VIDEO_VIEWS = ("query row", "rollout")  # class attention does not take videos yet
REDUCTIONS = ("mean", "max", "min")
CLICK_HINT = "<br><sup>click a patch to make it the query</sup>"
UNUSED_CONTROLS_HINT = "<br><sup>layer and head do not apply</sup>"
CLIP_SCALE = "<br>over clip"  # a clip's colour bar: one scale over all its frames

Query = str | tuple[int, ...]  # "cls", a patch (row, col), a video's patch (frame, row, col)


@dataclass
class _View:
    """What the current controls show: ``values`` (gh, gw), a clip's (T', gh, gw); the title
    (without hints); the colour scale, its bar's title and range (None: automatic); the query
    patch and the grid it lies on (None where no patch is outlined)."""

    values: Tensor
    title: str
    scale: str
    value: str
    zrange: tuple[float, float] | None
    patch: tuple[int, ...] | None = None
    grid: tuple[int, int] | None = None


class AttentionExplorer(Explorer):
    """Attention of a ViT-family model, interactively.

    Views: "query row" (the attention of the chosen query over the patches, at the chosen
    layer and head; click a patch to make it the query), "class attention" (CaiT's class
    token, or the ViT CLS row of the last layer), "rollout". Each analysis runs once per image
    and is cached; moving a slider only redraws.

    A video model's clips (B, T, C, H, W) add a "frame" slider: the figure shows the chosen
    frame with its token frame's map, on one colour scale over the whole clip (so frames
    compare); a click picks the (token frame, row, col) patch; the static copy shows every frame
    side by side. Class attention does not take clips yet, so that view is not offered.

    Args:
        model: a ViT-family model (timm VisionTransformer, Cait, vizkit models), or a video
            transformer (ViViT, VideoMAE, V-JEPA 2).
        images: (B, C, H, W) normalized for the model; a video model's clips (B, T, C, H, W).
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
        self.video = video_input(model) is not None
        with running(type(self).__name__, videos=True):  # each view's analysis says if it does
            self.model, self.images = model, check_images(model, images)
        self.display = display_images(images, model, mean, std)  # (B, [T,] H, W, 3)
        depth = len(analysis.self_attention_names(HookedModel(model)))
        first = self._attention(0, depth - 1)  # raises for models without self-attention
        self.query: Query = default_query(first)
        self._query_grid = first.layout.grid  # the grid a patch query was chosen on
        heads = first.patterns.shape[2]
        self.image = widgets.IntSlider(
            0, 0, len(images) - 1, description="clip" if self.video else "image"
        )
        self.view = widgets.ToggleButtons(options=VIDEO_VIEWS if self.video else VIEWS,
                                          description="view")  # fmt: skip
        self.layer = widgets.IntSlider(depth - 1, 0, depth - 1, description="layer")
        self.head = widgets.Dropdown(
            options=[*REDUCTIONS, *range(heads)], value="mean", description="head"
        )
        self.frame = widgets.IntSlider(0, 0, images.shape[1] - 1, description="frame") if (
            self.video) else None  # fmt: skip
        frame = [self.frame] if self.frame else []
        self.controls = [self.image, *frame, self.layer, self.head, self.view]
        self._observe(*self.controls)
        self.refresh()

    def select(self, query: Query) -> None:
        """Make ``query`` ("cls", a patch (row, col), a video's (frame, row, col) with its
        token frame) the query of the "query row" view."""
        length = 3 if self.video else 2
        if query != "cls" and (not isinstance(query, tuple) or len(query) != length):
            what = "(token frame, row, col)" if self.video else "(row, col)"
            raise ValueError(f"query must be 'cls' or a patch {what}; got {query!r}.")
        self.query = query
        self._query_grid = self._attention(self.image.value, self.layer.value).layout.grid
        self.refresh()

    def _query_on(self, layout) -> Query:
        """The query on ``layout``'s grid: a patch is moved to the same place of another stage's
        grid; the class token falls back to the centre patch where there is none."""
        if self.query == "cls":
            return "cls" if layout.class_token else centre_patch(layout)
        *frame, row, col = self.query
        (gh, gw), (qh, qw) = layout.grid, self._query_grid
        return (*frame, row * gh // qh, col * gw // qw)

    def _attention(self, image: int, layer: int) -> analysis.AttentionResult:
        """One layer's maps of one image (layers of a hierarchical model differ in grid)."""
        return self.cached(
            ("attention", image, layer),
            lambda: analysis.attention(self.model, self.images[image : image + 1], layers=layer),
        )

    def _view(self) -> _View:
        i, view = self.image.value, self.view.value
        if view == "query row":
            result = self._attention(i, self.layer.value)
            query = self._query_on(result.layout)
            rows = result.row(query)[0, 0]  # (H, [T',] gh, gw)
            head = self.head.value
            values = rows[head] if isinstance(head, int) else reduce_heads(rows, head, head_dim=0)
            title = f"Attention of {query_label(query)} at layer {result.layers[0]}, head {head}"
            patch = None if query == "cls" else query
            return _View(values, title, ATTENTION_SCALE, "weight", weight_range(values), patch,
                         result.layout.grid)  # fmt: skip
        values = self._saliency(view, i).maps[0]
        what = "clip" if self.video else "image"
        zrange = (values.min().item(), values.max().item()) if self.video else None
        return _View(values, f"{view} of {what} {i}", SALIENCY_SCALE, view, zrange)

    def _figure(self) -> go.Figure:
        shown = self._view()
        hint = CLICK_HINT if self.view.value == "query row" else UNUSED_CONTROLS_HINT
        image, values, patch = self.display[self.image.value], shown.values, shown.patch
        title = shown.title
        if self.video:
            t, count = self.frame.value, len(image)
            at = map_frame(t, count, len(values))
            image, values = image[t], values[at]
            title += f", frame {t} of {count}"
            patch = patch[1:] if patch is not None and patch[0] == at else None
        value = shown.value + CLIP_SCALE * self.video
        fig = go.Figure(heatmap_on_image(image, values, colorscale=shown.scale, value=value,
                                         zrange=shown.zrange))  # fmt: skip
        if patch is not None:
            outline_patch(fig, patch, shown.grid, self.display.shape[-3:-1])
        map_axes(fig)
        return finish(fig, title + hint, 520)

    def _static_figure(self) -> go.Figure:
        """A clip's frames side by side, each with its token frame's map (the query patch
        outlined on the frames of its token frame); an image's view as the widget shows it."""
        if not self.video:
            return self.figure
        shown, clip = self._view(), self.display[self.image.value]
        count, (low, high) = len(clip), shown.zrange
        colorbar = {"title": {"text": shown.value + CLIP_SCALE}}
        fig = clip_grid(clip, [shown.values], [f"frame {t}" for t in range(count)],
                        {"colorscale": shown.scale, "cmin": low, "cmax": high,
                         "colorbar": colorbar})  # fmt: skip
        if shown.patch is not None:
            for t in range(count):
                if map_frame(t, count, len(shown.values)) == shown.patch[0]:
                    outline_patch(fig, shown.patch[1:], shown.grid, clip.shape[1:3],
                                  **clip_cell(0, t, count))  # fmt: skip
        return finish(fig, shown.title)

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
        layout = self._attention(self.image.value, self.layer.value).layout
        (gh, gw), (height, width) = layout.grid, self.display.shape[-3:-1]
        patch = (int(row * gh // height), int(col * gw // width))
        if self.video:  # the token frame of the frame shown
            patch = (map_frame(self.frame.value, self.images.shape[1], layout.frames), *patch)
        self.select(patch)
