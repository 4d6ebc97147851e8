"""HeadExplorer: the heads of a CLIP-family model in words (TextSpan), one at a time: the texts
that span what the head writes, the images it writes most along the chosen text, where in an
image it reads from (its source tokens' shares of the cosine with the text), and what
mean-ablating its direct contribution does to the zero-shot prediction."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots
from torch import Tensor, nn

from ..concepts.naming import checked_head_names
from ..hooks.inputs import check_images
from ..models.zero_shot import image_tower
from ..targets import embed
from ..text import TextSpan, embedding_decomposition
from ..viz import display_images
from ..viz.mechanistic import DIVERGING
from ..viz.overlay import heatmap_on_image
from ..viz.style import finish
from .explorer import Explorer

__all__ = ["HeadExplorer"]

COLUMNS = 4  # top images per row


class HeadExplorer(Explorer):
    """Explore the heads ``span`` describes over ``images`` (the images it was computed on).

    For the chosen head and one of its texts: the ``top`` images the head writes most along the
    text (each with the head's source-token map on it), the current image's map, and the
    current image's zero-shot class probabilities before and after the head's direct
    contribution is replaced by its mean over the images (Gandelsman et al. 2024, Sec. 3.2).

    Args:
        model: the CLIP-family model ``span`` was computed on (its image tower is run on the
            current image for the token map).
        span: `vk.text_span`'s result on ``images``.
        images: (N, C, H, W) the images, in the model's normalization.
        class_texts: (K, D) the classes' text embeddings (`vizkit.targets.encode_texts`).
        classes: the K class names; mean, std: to show the images.
        names: the heads' names, a `vk.concepts` result of `vk.concepts.Heads` of one of the
            span's blocks, or a list of them (`vk.concepts.head_names`): shown beside each
            head and in the title.
    """

    def __init__(
        self, model: nn.Module, span: TextSpan, images: Tensor, class_texts: Tensor,
        classes: Sequence[str], mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None, top: int = 8, names: object = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.names = checked_head_names(names, list(span.blocks), "this span")
        if len(images) != len(span.decomposition.embedding):
            raise ValueError(
                f"span describes {len(span.decomposition.embedding)} images; got {len(images)}: "
                "pass the images it was computed on."
            )
        if len(classes) != len(class_texts):
            raise ValueError(f"{len(classes)} class names for {len(class_texts)} class texts.")
        self.model, self.span, self.top = model, span, top
        self.images = check_images(model, images)
        _check_span_images(model, span, self.images)
        self.display = display_images(images, model, mean, std)
        self.class_texts = F.normalize(class_texts.float(), dim=-1)
        self.classes = list(classes)
        self.block = widgets.Dropdown(options=list(span.blocks), value=span.blocks[-1],
                                      description="block")  # fmt: skip
        self.head = widgets.Dropdown(options=self._head_options(span.blocks[-1]),
                                     description="head")  # fmt: skip
        self.text = widgets.Dropdown(description="text")
        self.image = widgets.IntSlider(0, min=0, max=len(images) - 1, description="image")
        self.controls = [self.block, self.head, self.text, self.image]
        self._relist()
        self._relisting = self._relabelling = False
        self.block.observe(self._rehead, names="value")
        self.head.observe(self._rehead, names="value")
        self._observe(self.text, self.image)
        self.refresh()

    def refresh(self, *_) -> None:
        if not self._relisting:
            super().refresh()

    def _rehead(self, change: dict | None = None) -> None:
        if self._relabelling:
            return
        if self.names and change is not None and change.get("owner") is self.block:
            head = self.head.value
            self._relabelling = True
            try:  # the new block's heads' names, the head kept
                self.head.options = self._head_options(self.block.value)
                self.head.value = head
            finally:
                self._relabelling = False
        self._relist()
        self.refresh()

    def _head_options(self, block: str) -> list[tuple[str, int]]:
        """(label, head) of each head of ``block``: its number, and its name where named."""
        return [(f"{h} {self.names[f'{block} head {h}']}" if f"{block} head {h}" in self.names
                 else str(h), h) for h in range(self.span.heads)]  # fmt: skip

    def _relist(self) -> None:
        """The chosen head's texts, with the share of its variance explained after each."""
        b = self.span.blocks.index(self.block.value)
        texts = self.span.texts(b, self.head.value)
        explained = self.span.explained[b, self.head.value].tolist()
        self._relisting = True
        try:
            self.text.options = [(f"{t} ({e:.0%})", i) for i, (t, e) in
                                 enumerate(zip(texts, explained, strict=False))]  # fmt: skip
            self.text.value = 0
        finally:
            self._relisting = False

    def token_map(self, image: int) -> Tensor:
        """(gh, gw) the chosen head's source tokens' shares of the cosine between ``image``'s
        embedding and the chosen text."""
        block, head, text = self.block.value, self.head.value, self.text.value
        split = self.cached(("split", image, block), lambda: embedding_decomposition(
            self.model, self.images[[image]], tokens=block, check_heads=False))  # fmt: skip
        index = int(self.span.indices[self.span.blocks.index(block), head, text])
        direction = F.normalize(self.span.text_embeddings[index], dim=-1)
        shares = split.tokens[0, 0, head] @ direction / split.embedding[0].norm()  # (N,)
        _, patches = split.layout.split(shares, dim=0)
        return split.layout.to_grid(patches)

    def probabilities(self, image: int) -> tuple[Tensor, Tensor]:
        """(K,) the zero-shot class probabilities of ``image``, and the same with the chosen
        head's direct contribution replaced by its mean over the images."""
        decomposition = self.span.decomposition
        b = decomposition.blocks.index(self.block.value)
        heads = decomposition.heads[:, b, self.head.value]
        clean = decomposition.embedding[image]
        ablated = clean - heads[image] + heads.mean(0)
        scale = float(getattr(self.model, "logit_scale", torch.tensor(4.6)).detach().exp())
        return tuple((scale * F.normalize(e, dim=-1) @ self.class_texts.T).softmax(-1)
                     for e in (clean, ablated))  # fmt: skip

    def _figure(self) -> go.Figure:
        b = self.span.blocks.index(self.block.value)
        head, text = self.head.value, self.text.value
        shown = self.span.top_images(b, head, text, self.top).tolist()
        rows = -(-len(shown) // COLUMNS)
        current = self.image.value
        titles = [f"image {i}" for i in shown] + [""] * (rows * COLUMNS - len(shown))
        titles = [t for r in range(rows) for t in (*titles[r * COLUMNS : (r + 1) * COLUMNS], "")]
        titles += [f"image {current}: where the head reads", "zero-shot probability", ""]
        fig = make_subplots(
            rows=rows + 1, cols=COLUMNS + 1, subplot_titles=titles, horizontal_spacing=0.02,
            vertical_spacing=0.12, column_widths=[1] * COLUMNS + [0.2],
            specs=[[{}] * (COLUMNS + 1)] * rows
            + [[{"colspan": 2}, None, {"colspan": 2}, None, {}]],
        )  # fmt: skip
        maps = [self.token_map(i) for i in [*shown, current]]
        largest = max(float(m.abs().max()) for m in maps) or 1.0
        for n, image in enumerate([*shown, current]):
            row, col = divmod(n, COLUMNS) if n < len(shown) else (rows, 0)
            for trace in heatmap_on_image(self.display[image], maps[n], coloraxis="coloraxis",
                                          name=f"image {image}"):  # fmt: skip
                fig.add_trace(trace, row=row + 1, col=col + 1)
            x_axis = fig.get_subplot(row + 1, col + 1).xaxis.plotly_name  # "xaxis3"
            fig.update_xaxes(showticklabels=False, row=row + 1, col=col + 1)
            fig.update_yaxes(showticklabels=False, autorange="reversed", row=row + 1,
                             col=col + 1, scaleanchor=x_axis.replace("axis", ""))  # fmt: skip
        # the current image to the left of its two columns: the bars' ticks and axis title
        # beside it keep clear of it at any width
        fig.update_xaxes(constraintoward="left", row=rows + 1, col=1)
        fig.update_layout(coloraxis={
            "colorscale": DIVERGING, "cmin": -largest, "cmax": largest,
            "colorbar": {"title": {"text": "share of cosine"}, "x": 1.0, "y": 1.0,
                         "yanchor": "top", "len": 0.6},
        })  # fmt: skip
        clean, ablated = self.probabilities(current)
        order = (clean + ablated).argsort(descending=True)[:5].tolist()
        names = [self.classes[i] for i in order]
        fig.add_trace(go.Bar(x=names, y=clean[order].tolist(), name="clean",
                             marker_color="#9e9e9e"), row=rows + 1, col=3)  # fmt: skip
        fig.add_trace(go.Bar(x=names, y=ablated[order].tolist(), name="head mean-ablated",
                             marker_color="#d62728"), row=rows + 1, col=3)  # fmt: skip
        # the bars' axis on their right, in the empty column under the colour bar: clear of
        # the image on their left at any width
        fig.update_yaxes(title_text="probability", tickformat=".0%", side="right",
                         row=rows + 1, col=3)  # fmt: skip
        fig.update_layout(barmode="group", legend={"orientation": "h", "y": -0.1, "x": 0.45})
        name = self.span.texts(b, head)[text]
        named = self.names.get(f"{self.block.value} head {head}")
        called = "" if named is None else f" ({named.split(' (')[0]})"
        title = (
            f"{self.block.value}, head {head}{called}: the images it writes most along {name!r}"
            f"<br><sup>its text {text + 1}; on each image the head's source tokens' shares of "
            "the cosine with the text</sup>"
        )
        return finish(fig, title, 230 * (rows + 1) + 120)


def _check_span_images(model: nn.Module, span: TextSpan, images: Tensor) -> None:
    """Refuse ``images`` (N, C, H, W) that are not the ones ``span`` was computed on: the
    image embeddings of the first, middle and last are computed again and compared with the
    span's (other images of the same count showed another image's top images)."""
    picks = sorted({0, len(images) // 2, len(images) - 1})
    clip_like = callable(getattr(model, "encode_image", None)) or callable(
        getattr(model, "get_image_features", None)
    )
    again = embed(image_tower(model) if clip_like else model, images[picks]).float()
    stored = span.decomposition.embedding[picks].float().to(again.device)
    tolerance = 1e-3 * float(stored.norm(dim=-1).max())  # float sums on another machine
    wrong = [i for i, a, b in zip(picks, again, stored, strict=True)
             if float((a - b).abs().max()) > tolerance]  # fmt: skip
    if wrong:
        raise ValueError(
            f"Images {wrong} are not the ones span was computed on (their image embeddings "
            "differ from the span's): pass the images given to vk.text_span, in the same order "
            "and normalization."
        )
