"""CircuitExplorer: the circuit of a batch of clean and corrupted images, growing with a slider
(its faithfulness beside it), and where on the image each node's effect lies."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor, nn

from ..circuits import attribution_patching, circuit, faithfulness
from ..concepts.naming import checked_head_names
from ..hooks import Target
from ..hooks.inputs import check_image_pairs
from ..viz import display_images
from ..viz.circuits import graph_axes, graph_traces
from ..viz.mechanistic import DIVERGING
from ..viz.overlay import heatmap_on_image
from ..viz.style import finish
from .explorer import Explorer

__all__ = ["CircuitExplorer"]

CLICK_HINT = "<br><sup>click a node to see its effect on each patch</sup>"
RECOVERED = 0.8  # the circuit first shown: the smallest that recovers this share of the score


class CircuitExplorer(Explorer):
    """Attribution patching of the pairs (clean, corrupted) and the faithfulness of its circuits
    (`vizkit.circuits.attribution_patching`, `vizkit.circuits.faithfulness`), computed once.

    The graph (top): layers as columns, nodes sized by their mean effect on the score and pale
    outside the circuit, the circuit's edges drawn with widths by their scores. The slider
    "edges kept" grows the circuit through the sizes whose faithfulness was measured (bottom
    left, the current size marked). Bottom right: the chosen node's effect at each patch of
    one image (``tokens`` of the result); a click on a node chooses it.

    Args:
        model: a transformer whose blocks name a residual stream (docs/coverage.md).
        clean, corrupted: (B, C, H, W) pairs of images, normalized for the model.
        target, versus, method, heads: as `vizkit.circuits.attribution_patching`.
        sizes: the circuit sizes (edges) to measure; default 1, 2, 4, ... and every edge.
        classes: class names for the title; mean, std: to show the images.
        progress: progress bars while the attribution and faithfulness run.
        names: the heads' names, a `vk.concepts` result of `vk.concepts.Heads` of a block, or
            a list of them (`vk.concepts.head_names`): shown beside each head's node in the
            node list and the titles.
    """

    CONTROL_HINTS = (CLICK_HINT,)

    def __init__(
        self,
        model: nn.Module,
        clean: Tensor,
        corrupted: Tensor,
        target: Target = None,
        versus: Target = None,
        method: str = "eap-ig",
        heads: bool = True,
        sizes: Sequence[int] | None = None,
        classes: Sequence[str] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        progress: bool = True,
        names: object = None,
    ) -> None:
        super().__init__()
        clean, corrupted = check_image_pairs(model, clean, corrupted)
        self.result = attribution_patching(model, clean, corrupted, target, versus,
                                           method=method, heads=heads,
                                           progress=progress)  # fmt: skip
        self.curve = faithfulness(model, self.result, clean, corrupted, sizes=sizes,
                                  progress=progress)  # fmt: skip
        blocks = [d.removesuffix(" attn in") for d in self.result.downstream
                  if d.endswith(" attn in")]  # fmt: skip
        self.names = checked_head_names(names, blocks, "the circuit")
        if self.names and not set(self.names) & set(self.result.upstream):
            raise ValueError(
                "The circuit has no node per head (heads=False), so no head's name can be shown: "
                "pass heads=True."
            )
        self.classes = classes
        self._score_label = getattr(target, "label", None)  # a score target's (`vizkit.targets`)
        self.display = display_images(clean, model, mean, std)
        kept = [int(s) for s in self.curve.sizes]
        enough = [s for s, f in zip(kept, self.curve.faithfulness.tolist(), strict=True)
                  if f >= RECOVERED and s > 0]  # fmt: skip
        self.size = widgets.SelectionSlider(options=kept, value=enough[0] if enough else kept[-1],
                                            description="edges kept")  # fmt: skip
        self.image = widgets.IntSlider(0, 0, len(clean) - 1, description="image")
        effects = self.result.nodes.mean(0).abs()
        effects[0] = -1 if len(effects) > 1 else 0  # the embedding: the whole corruption
        largest = int(effects.argmax())
        self.node = widgets.Dropdown(options=[(self._node(u), u) for u in range(len(effects))],
                                     value=largest, description="node")  # fmt: skip
        self.controls = [self.size, self.image, self.node]
        self._observe(*self.controls)
        self.refresh()

    def _figure(self) -> go.Figure:
        result, size, u, i = self.result, self.size.value, self.node.value, self.image.value
        chosen = circuit(result, size)
        inside = chosen.edges.any(1)
        inside[u] = True  # the chosen node stands out, in the circuit or not
        at = self.curve.sizes.tolist().index(size)
        recovered = float(self.curve.faithfulness[at])
        titles = [
            f"the circuit: {size} of {int(self.curve.sizes[-1])} edges",
            f"faithfulness (CPR {self.curve.cpr:.2f})",
            f"{self._node(u)}: its effect on image {i}",
        ]
        fig = make_subplots(rows=2, cols=2, specs=[[{"colspan": 2}, None], [{}, {}]],
                            row_heights=[0.55, 0.45], vertical_spacing=0.2,
                            horizontal_spacing=0.12, subplot_titles=titles)  # fmt: skip
        traces, ticks = graph_traces(result.upstream, result.downstream, chosen.scores,
                                     chosen.edges, result.nodes.mean(0), ~inside)  # fmt: skip
        for trace in traces:
            fig.add_trace(trace, row=1, col=1)
        self._nodes_trace = len(traces) - 1  # `graph_traces` draws the nodes last
        rings = [3 if v == u else 1 for v in range(len(result.upstream))]
        fig.data[self._nodes_trace].marker.line.width = rings  # the chosen node ringed
        graph_axes(fig, ticks, row=1, col=1)
        self._faithfulness(fig, at)
        prefix = self._node_map(fig, u, i)
        effect = float(result.nodes[i, u])
        title = (
            f"Circuit of {self._score_name()}: {size} edges recover {recovered:.2f} of the "
            f"score<br><sup>{self._node(u)} changes image {i}'s score by {effect:+.3g} "
            f"({prefix})</sup>" + CLICK_HINT
        )
        return finish(fig, title, 820)

    def _node(self, u: int) -> str:
        """Node ``u``'s name, with its concept name (without its score) where named."""
        node = self.result.upstream[u]
        named = self.names.get(node)
        return node if named is None else f"{node} ({named.split(' (')[0]})"

    def _faithfulness(self, fig: go.Figure, at: int) -> None:
        """The curve over the share of edges kept, the current size marked."""
        share, recovered = 100 * self.curve.share, self.curve.faithfulness
        fig.add_trace(go.Scatter(
            x=share.tolist(), y=recovered.tolist(), mode="lines+markers", showlegend=False,
            line={"color": "#555555"}, text=[f"{int(s)} edges" for s in self.curve.sizes],
            hovertemplate="%{text}: %{y:.3f}<extra></extra>",
        ), row=2, col=1)  # fmt: skip
        fig.add_trace(go.Scatter(
            x=[float(share[at])], y=[float(recovered[at])], mode="markers", showlegend=False,
            marker={"size": 13, "color": "#ff7f0e", "line": {"width": 1, "color": "#333"}},
            hoverinfo="skip",
        ), row=2, col=1)  # fmt: skip
        fig.update_xaxes(title_text="edges kept (% of the graph's)", row=2, col=1)
        fig.update_yaxes(title_text="score recovered", row=2, col=1)

    def _node_map(self, fig: go.Figure, u: int, i: int) -> str:
        """Node ``u``'s effect at each patch of image ``i`` over the image; returns what its
        prefix tokens (class, registers) hold of it, for the title."""
        layout = self.result.layout
        prefix, patches = layout.split(self.result.tokens[i : i + 1, u], dim=1)
        grid = layout.to_grid(patches)[0]  # (gh, gw)
        top = max(float(grid.abs().max()), 1e-12)
        for trace in heatmap_on_image(self.display[i], grid, colorscale=DIVERGING,
                                      zrange=(-top, top), value="effect"):  # fmt: skip
            fig.add_trace(trace, row=2, col=2)
        fig.update_traces(colorbar={"len": 0.4, "y": 0, "yanchor": "bottom", "thickness": 12},
                          selector={"type": "heatmap"})  # fmt: skip
        fig.update_xaxes(showticklabels=False, title_text="patches", row=2, col=2)
        fig.update_yaxes(showticklabels=False, autorange="reversed", scaleanchor="x3",
                         constrain="domain", title_text="", row=2, col=2)  # fmt: skip
        if not prefix.numel():
            return "all of it at the patches"
        return f"{float(prefix.sum()):+.3g} of it at the tokens before the patches"

    def _score_name(self) -> str:
        """What the score is: a class's logit (less another's), or the score target's."""
        targets, versus = self.result.targets, self.result.versus
        if targets is None:
            return f"the {self._score_label}" if self._score_label else "the score"

        def name(c: int) -> str:
            return self.classes[c] if self.classes else f"class {c}"

        classes = sorted({int(c) for c in targets})
        what = name(classes[0]) if len(classes) == 1 else "each image's class"
        if versus is None:
            return f"the logit of {what}"
        others = sorted({int(c) for c in versus})
        return f"{what} vs {name(others[0]) if len(others) == 1 else 'another'}"

    def _connect_clicks(self) -> None:
        """A click on a node chooses it."""
        self.figure.data[self._nodes_trace].on_click(self._clicked)

    def _clicked(self, trace, points, state) -> None:
        if points.point_inds:
            self.node.value = points.point_inds[0]
