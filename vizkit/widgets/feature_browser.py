"""FeatureBrowser: the latents of a sparse autoencoder, one at a time: where they fire, what
they write to the logits, and what removing or adding them does to the prediction."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor, nn

from ..concepts.naming import unit_names
from ..hooks.inputs import check_images
from ..hooks.scores import is_backbone
from ..hooks.video import running
from ..sae import Intervention, SparseAutoencoder, features
from ..sae.effects import ablation, effects_and_run, steering
from ..sae.image_outputs import ImageOutputs, TensorCache
from ..store import ActivationStore
from ..viz import display_images
from ..viz.overlay import heatmap_on_image
from ..viz.style import SALIENCY_SCALE, finish
from .explorer import Explorer
from .redraw import MIN_WIDTH, PLOTLY_WIDTH

__all__ = ["FeatureBrowser"]

ORDERS = ("density", "logit effect", "clicked patch")
ACTIONS = ("ablate", "steer")
CLICK_HINT = "<br><sup>click a patch to list the latents firing there</sup>"
COLUMNS = 4  # top images per row
GAP_PX = 80  # px between the images and the bars: room for the bars' ticks and axis title
LISTED = 200  # latents in the list at a time
MAP_BYTES = 256 * 2**20  # the images' heat maps kept


class FeatureBrowser(Explorer):
    """Browse the latents of ``sae`` over the images of its store.

    The list holds the latents in the chosen order: densest first, largest direct effect on
    the chosen class first (`vk.sae.logit_effects`), or firing most at the patch last clicked.
    For the selected latent: its heat map over each of its top images (read from the store),
    its direct logit effects, and the mean class probabilities before and after ablating it on
    those images, or steering the images it fires least on by ``strength`` times its largest
    activation.

    Args:
        model: the model whose store ``sae`` was trained on.
        sae: a `vk.sae.SparseAutoencoder` of a store of patch (or all) tokens.
        images: (N, C, H, W) the store's images, in its order and the model's normalization
            (checked against the store's hashes).
        classes: class names; mean, std: to show the images.
        top: images shown per latent.
        store: the store to browse (default the one ``sae`` was trained on), e.g. one of
            held-out images of the same layer.
        names: the latents' names, a `vk.concepts` result of this autoencoder's latents
            (`Dissection`, `CLIPDissection`, `NamedUnits` or `Probes`): shown in the list and
            the title.
    """

    CONTROL_HINTS = (CLICK_HINT,)

    def __init__(
        self,
        model: nn.Module,
        sae: SparseAutoencoder,
        images: Tensor,
        classes: Sequence[str] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        top: int = 8,
        store: ActivationStore | str | None = None,
        names: object = None,
    ) -> None:
        super().__init__()
        self.model, self.sae, self.top = model, sae, top
        self.names = {} if names is None else _latent_names(names, sae)
        self.features = features(sae, store, top=top, progress=False)
        self.features.store.check_images(images)
        with running(type(self).__name__, videos=False):  # it draws images: a clip is refused
            self.images = check_images(model, images)
        self.display = display_images(images, model, mean, std)
        self.outputs = ImageOutputs(model, sae, self.images)  # each clean one computed once
        probe = list(range(min(16, len(images))))
        try:  # the logit effects' forward also gives the probe's outputs
            self.effects, run = effects_and_run(self.outputs.hm, sae, self.images[probe])
            self.outputs.add(probe, run)
        except ValueError:  # no direct path (an inner activation): no logit-effect order
            self.effects = None
        self.classes = list(classes) if classes is not None else None
        self.clicked: tuple[int, int] | None = None  # (image, token)
        self._maps = TensorCache(MAP_BYTES)  # image -> (latents, gh, gw) its heat maps
        self.order = widgets.ToggleButtons(options=self._orders(), description="order")
        count = 0 if self.effects is None else self.effects.effects.shape[0]
        self.cls = widgets.Dropdown(options=self._class_options(count, ""), description="class")
        self.find = widgets.Text(placeholder="type to filter the classes", description="find")
        self.action = widgets.ToggleButtons(options=ACTIONS, description="intervention")
        self.strength = widgets.FloatSlider(1.0, min=-2.0, max=2.0, step=0.25,
                                            description="steer x max")  # fmt: skip
        self.latent = widgets.Select(rows=14, description="latent")
        self.controls = [self.order, self.cls, self.find, self.strength, self.action]
        self._relist()
        self._relisting = self._filtering = False
        self._observe(self.action, self.strength)
        self.latent.observe(self._chosen, names="value")
        self.order.observe(self._reorder, names="value")
        self.cls.observe(self._reorder, names="value")
        self.find.observe(lambda _: self._filter_classes(count), names="value")
        self.refresh()

    @property
    def widget(self) -> widgets.VBox:
        box = super().widget
        grid, progress, plot = box.children
        self.latent.layout = widgets.Layout(width="230px", height="100%", flex="none")
        # the plot takes the row's width beside the list (what its `PageWidth` measures), or
        # the next row's where it would be narrower than MIN_WIDTH
        plot.layout.width, plot.layout.flex = "auto", f"1 1 {MIN_WIDTH}px"
        row = widgets.HBox([self.latent, plot], layout={"width": "100%", "flex_flow": "row wrap"})
        return widgets.VBox([grid, progress, row], _dom_classes=box._dom_classes)

    def _inputs(self) -> list[widgets.Widget]:
        return [*super()._inputs(), self.latent]

    def _connect_clicks(self) -> None:
        """A click on a patch of a top image lists the latents firing there."""
        for trace in self.figure.data:
            if isinstance(trace, go.Heatmap) and trace.meta is not None:
                trace.on_click(self._clicked)

    def ordered(self) -> Tensor:
        """(n,) the latents in the list's order."""
        if self.order.value == "logit effect" and self.effects is not None:
            alive = self.features.density > 0
            order = self.effects.by_class(self.cls.value)
            return order[alive[order]]
        if self.order.value == "clicked patch" and self.clicked is not None:
            return torch.tensor([i for i, _ in self.features.at_token(*self.clicked, count=LISTED)],
                                dtype=torch.long)  # fmt: skip
        return self.features.by_density()

    def _chosen(self, *_) -> None:
        if not self._relisting:
            self.refresh()

    def _orders(self) -> tuple[str, ...]:
        return ORDERS if self.effects is not None else ("density", "clicked patch")

    def _reorder(self, *_) -> None:
        if self._filtering:
            return
        self._relist()
        self.refresh()

    def _relist(self) -> None:
        latents = self.ordered()[:LISTED].tolist()
        if not latents:
            latents = self.features.by_density()[:LISTED].tolist()
        self._relisting = True  # the list's own changes redraw once, after
        try:
            self.latent.options = [(self._label(i), i) for i in latents]
            self.latent.value = latents[0]
        finally:
            self._relisting = False

    def _class_options(self, count: int, text: str) -> list[tuple[str, int]]:
        """The class list's (name, class) entries whose name holds ``text`` (any case)."""
        names = [(self._name(c), c) for c in range(count)]
        return [(name, c) for name, c in names if text.lower() in name.lower()]

    def _filter_classes(self, count: int) -> None:
        """The class list cut to the classes whose name holds the search text; the class chosen
        kept where it is among them; a text no class holds leaves the list as it was."""
        options = self._class_options(count, self.find.value.strip())
        if not options:
            return
        chosen = self.cls.value
        self._filtering = True  # one reorder below, not one per step
        try:
            self.cls.options = options
            if chosen in [c for _, c in options]:
                self.cls.value = chosen
        finally:
            self._filtering = False
        if self.cls.value != chosen:
            self._reorder()

    def _name(self, cls: int) -> str:
        return self.classes[cls] if self.classes is not None else f"class {cls}"

    def _label(self, latent: int) -> str:
        named = f" {self.names[latent].split(' (')[0]}" if latent in self.names else ""
        label = f"{latent}{named}: fires {float(self.features.density[latent]):.1%}"
        if self.effects is not None:
            cls, effect = self.effects.top_classes(latent, 1)[0]
            label += f", {self._name(cls)} {effect:+.2g}"
        return label

    def _figure(self) -> go.Figure:
        latent = self.latent.value
        shown = self.features.top_images(latent, self.top)
        rows = max(2, -(-len(shown) // COLUMNS))
        edited, result = self._intervention(latent)
        titles = []
        for row in range(rows):
            for col in range(COLUMNS):
                n = row * COLUMNS + col
                titles.append(f"{shown[n][0]}: {shown[n][1]:.2g}" if n < len(shown) else "")
            titles += ["", {0: f"{result.what.split(' at ')[0]} ({len(result.clean)} images)",
                            1: "direct logit effect"}.get(row, "")]  # fmt: skip
        # the column between the images and the bars holds the bars' ticks and axis title
        plot = (self._plot.width or PLOTLY_WIDTH) - 70
        gap = max(0.45, GAP_PX * (COLUMNS + 2.2) / max(plot - GAP_PX, 1))
        fig = make_subplots(rows=rows, cols=COLUMNS + 2, horizontal_spacing=0.015,
                            vertical_spacing=0.2, column_widths=[1] * COLUMNS + [gap, 2.2],
                            subplot_titles=titles)  # fmt: skip
        largest = max(float(self.features.max_activation[latent]), 1e-6)
        for n, (image, _) in enumerate(shown):
            row, col = divmod(n, COLUMNS)
            heat = self._heatmap(latent, image, [i for i, _ in shown])
            for trace in heatmap_on_image(self.display[image], heat, coloraxis="coloraxis",
                                          name=f"image {image}"):  # fmt: skip
                trace.meta = image if isinstance(trace, go.Heatmap) else None
                fig.add_trace(trace, row=row + 1, col=col + 1)
            fig.update_xaxes(showticklabels=False, row=row + 1, col=col + 1)
            axis = row * (COLUMNS + 2) + col + 1
            fig.update_yaxes(showticklabels=False, autorange="reversed", row=row + 1,
                             col=col + 1, scaleanchor=f"x{axis if axis > 1 else ''}")  # fmt: skip
        colorbar = {"title": {"text": "activation", "side": "top"}, "orientation": "h",
                    "x": 0, "xanchor": "left", "y": -0.12, "lenmode": "pixels", "len": 160,
                    "thickness": 12}  # fmt: skip
        fig.update_layout(coloraxis={"colorscale": SALIENCY_SCALE, "cmin": 0, "cmax": largest,
                                     "colorbar": colorbar})  # fmt: skip
        self._add_bars(fig, latent, edited, result)
        named = f" '{self.names[latent]}'" if latent in self.names else ""
        title = (
            f"Latent {latent}{named} of {self.sae.source['layer']}: fires on "
            f"{float(self.features.density[latent]):.1%} of stored tokens; its top images "
            "(image: its largest activation there)" + CLICK_HINT
        )
        return finish(fig, title, 200 + 200 * rows)

    def _heatmap(self, latent: int, image: int, shown: list[int]) -> Tensor:
        """(gh, gw) the latent's map over stored image ``image``: every latent's maps of an
        image read at once (`Features.heatmap`) and kept (at most MAP_BYTES, the images
        ``shown`` kept), so a new latent's top images seen before cost no encoding."""
        if image not in self._maps:
            self._maps[image] = self.features.heatmap(list(range(self.sae.latents)), image)
            self._maps.trim(set(shown))
        return self._maps[image][latent]

    def _add_bars(
        self, fig: go.Figure, latent: int, edited: list[int], result: Intervention
    ) -> None:
        """The right column: mean class probabilities before and after the intervention (on a
        backbone: each edited image's embedding cosine to its clean one), and the latent's
        largest direct logit effects."""
        col = COLUMNS + 2
        if result.output == "embedding":  # a backbone: how far each embedding moved
            fig.add_trace(go.Bar(x=[f"image {i}" for i in edited], y=result.cosine().tolist(),
                                 name="cosine to the clean embedding", marker_color="#d62728"),
                          row=1, col=col)  # fmt: skip
            fig.update_yaxes(title_text="cosine to clean", row=1, col=col)
            fig.update_xaxes(title_text="image", row=1, col=col)
            return
        clean, edited = result.clean.softmax(-1).mean(0), result.edited.softmax(-1).mean(0)
        order = (edited - clean).abs().argsort(descending=True)[:6].sort().values.tolist()
        names = [self._name(i) for i in order]
        after = "ablated" if self.action.value == "ablate" else "steered"
        fig.add_trace(go.Bar(x=names, y=clean[order].tolist(), name="clean",
                             marker_color="#9e9e9e"), row=1, col=col)  # fmt: skip
        fig.add_trace(go.Bar(x=names, y=edited[order].tolist(), name=after,
                             marker_color="#d62728"), row=1, col=col)  # fmt: skip
        fig.update_yaxes(title_text="mean probability", tickformat=".0%", row=1, col=col)
        if self.effects is not None:
            top = self.effects.top_classes(latent, 5)
            fig.add_trace(go.Bar(x=[self._name(c) for c, _ in top], y=[v for _, v in top],
                                 name="direct logit effect", marker_color="#1f77b4",
                                 showlegend=False),  # its subplot's title names it
                          row=2, col=col)  # fmt: skip
            fig.update_yaxes(title_text="logit per unit", row=2, col=col)
        fig.update_layout(barmode="group", legend={"orientation": "h", "y": -0.12, "x": 0.62})

    def _intervention(self, latent: int) -> tuple[list[int], Intervention]:
        """(the images edited, the intervention's result): each image's clean output computed
        once, the edited ones once per latent and edit (from the autoencoder's layer on, where
        `ImageOutputs` proved that path)."""
        if self.action.value == "ablate":
            chosen = [i for i, _ in self.features.top_images(latent, self.top)]
            edit, what = ablation(self.sae, latent)
            key = ("ablate", latent)
        else:
            chosen = self._quiet_images(latent)
            strength = self.strength.value * float(self.features.max_activation[latent])
            edit, what = steering(self.sae, latent, round(strength, 2))
            key = ("steer", latent, self.strength.value)
        edited = self.cached(key, lambda: self.outputs.edited(chosen, edit))
        kind = "embedding" if is_backbone(self.model) else "logits"
        result = Intervention(self.outputs.clean(chosen), edited,
                              f"{what} at {self.sae.source['layer']}", kind)  # fmt: skip
        return chosen, result

    def _quiet_images(self, latent: int) -> list[int]:
        """The ``top`` images the latent fires least on (the first images without the
        per-image maxima)."""
        if self.features.image_max is None:
            return list(range(min(self.top, len(self.images))))
        return self.features.image_max[:, latent].argsort(stable=True)[: self.top].tolist()

    def _inapplicable(self) -> set[widgets.Widget]:
        off = set()
        if self.action.value != "steer":
            off.add(self.strength)
        if self.order.value != "logit effect":
            off.update((self.cls, self.find))
        return off

    def _clicked(self, trace, points, state) -> None:
        if not points.xs:
            return
        grid = self.features.store.grid
        height, width = self.display.shape[1:3]
        col = int(points.xs[0] // (width / grid[1]))
        row = int(points.ys[0] // (height / grid[0]))
        token = self.features.store.prefix_tokens + row * grid[1] + col
        self.clicked = (int(trace.meta), token)
        if self.order.value == "clicked patch":
            self._reorder()
        else:
            self.order.value = "clicked patch"  # reorders


def _latent_names(names: object, sae: SparseAutoencoder) -> dict[int, str]:
    """latent -> its "name (score)" from a `vk.concepts` naming result of ``sae``'s latents;
    refuses one of other units."""
    units = getattr(names, "units", None)
    expected = [f"latent {i}" for i in range(sae.latents)]
    if units is not None and list(units) != expected:
        raise ValueError(
            f"These names are of other units ({units[0]}, ... {len(units)} units), not this "
            f"autoencoder's {sae.latents} latents; name its latents (e.g. "
            "vk.concepts.dissect(model, images, concepts, sae))."
        )
    if units is not None and getattr(names, "options", {}).get("layer") not in (
        None, sae.source.get("layer")):  # fmt: skip
        raise ValueError(
            f"These names are of {names.options['layer']}, not of this autoencoder's layer "
            f"{sae.source.get('layer')}."
        )
    return unit_names(names)
