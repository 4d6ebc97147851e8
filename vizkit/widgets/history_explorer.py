"""HistoryExplorer: an epoch slider over any quantity a training history tracked."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go

from ..analysis import ResidualRatios
from ..viz.style import epoch_shades, finish
from .explorer import Explorer

__all__ = ["HistoryExplorer", "tracked_quantities"]

_PER_LAYER = ("attn", "attn_unscaled", "mlp", "mlp_unscaled", "resid_norm", "resid_mid_norm")


def tracked_quantities(history: Sequence[dict]) -> dict[str, list[tuple[list[str], list] | None]]:
    """Every quantity of a history, per epoch: ``name -> [(labels, values) or None]``.

    Scalars (``test_accuracy``) have one label; per-layer entries (``attention_entropy``,
    ``cka_to_previous``, ``residual_ratios.attn``, ``layerscale.mlp.mean_abs``,
    ``masks.mean_abs_alpha``, ...) one per layer. None where an epoch did not record it
    (``cka_to_previous`` starts at epoch 2).
    """
    found: dict[str, list] = {}
    for epoch, record in enumerate(history):
        for name, labels, values in _flatten(record):
            found.setdefault(name, [None] * len(history))[epoch] = (labels, values)
    return found


def _flatten(record: dict):
    for key, value in record.items():
        if key == "epoch":
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield key, [key], [value]
        elif key == "residual_ratios":  # a ResidualRatios result, through the result protocol
            ratios = ResidualRatios.from_dict(value)
            for field in _PER_LAYER:
                yield f"{key}.{field}", ratios.layers, getattr(ratios, field).tolist()
        elif isinstance(value, dict) and key == "layerscale":
            for branch, stats in value.items():
                for stat, values in stats.items():
                    yield f"{key}.{branch}.{stat}", [str(i) for i in range(len(values))], values
        elif isinstance(value, dict) and key == "masks":  # the "masks" tracker
            yield from _mask_summaries(value)
        elif isinstance(value, dict):  # {layer name: value}
            yield key, [n.removesuffix(".hook_resid_post") for n in value], list(value.values())


def _mask_summaries(masks: dict):
    """Per-layer scalars of the "masks" tracker: mean |alpha| and |sigma| of GMM layers, the
    extroversion of ELM layers."""
    layers = list(masks)
    if all("alpha" in m for m in masks.values()):
        for field in ("alpha", "sigma"):
            values = [_mean_abs(m[field]) for m in masks.values()]
            yield f"masks.mean_abs_{field}", layers, values
    elif all("extroversion" in m for m in masks.values()):
        yield "masks.extroversion", layers, [m["extroversion"] for m in masks.values()]


def _mean_abs(rows: list[list[float]]) -> float:
    flat = [abs(v) for row in rows for v in row]
    return sum(flat) / len(flat)


class HistoryExplorer(Explorer):
    """Per-layer quantities across epochs (lighter = earlier, the chosen epoch bold black), or a
    scalar's curve with the chosen epoch marked.

    Args:
        history: a training history (list of per-epoch records) or a model card holding one.
    """

    def __init__(self, history: Sequence[dict] | dict) -> None:
        super().__init__()
        if isinstance(history, dict):
            history = history.get("history", [])
        if isinstance(history, str) or not all(isinstance(r, dict) for r in history):
            raise TypeError(
                "history must be a model card (dict) or its 'history': a list of one dict per "
                f"epoch; got {type(history).__name__}."
            )
        if not history:
            raise ValueError(
                "The history is empty: pass a card's 'history' (one record per epoch)."
            )
        self.history = list(history)
        self.quantities = tracked_quantities(self.history)
        options = sorted(self.quantities, key=lambda q: (not q.startswith(("test", "train")), q))
        self.quantity = widgets.Dropdown(options=options, value=options[0], description="quantity")
        self.epoch = widgets.IntSlider(len(self.history), 1, len(self.history), description="epoch")
        self.controls = [self.quantity, self.epoch]
        self._observe(*self.controls)
        self.refresh()

    def _figure(self) -> go.Figure:
        name, chosen = self.quantity.value, self.epoch.value
        series = self.quantities[name]
        fig = go.Figure()
        if all(entry is None or len(entry[0]) == 1 for entry in series):  # a scalar per epoch
            epochs = [e + 1 for e, entry in enumerate(series) if entry is not None]
            values = [entry[1][0] for entry in series if entry is not None]
            fig.add_trace(go.Scatter(x=epochs, y=values, mode="lines+markers", name=name))
            if series[chosen - 1] is not None:
                fig.add_trace(
                    go.Scatter(x=[chosen], y=[series[chosen - 1][1][0]], mode="markers",
                               marker={"size": 14, "color": "black"}, name=f"epoch {chosen}")
                )  # fmt: skip
            fig.update_xaxes(title_text="epoch", dtick=1)
            fig.update_yaxes(title_text=name, tickformat=".0%" if "accuracy" in name else None)
            return finish(fig, f"{name} per epoch", 420)
        shades = epoch_shades(len(series))
        for e, entry in enumerate(series):
            if entry is None:
                continue
            bold = e + 1 == chosen
            fig.add_trace(
                go.Scatter(
                    x=entry[0], y=entry[1], mode="lines+markers", name=f"epoch {e + 1}",
                    line={"color": "black" if bold else shades[e], "width": 4 if bold else 1.5},
                )
            )  # fmt: skip
        missing = "" if series[chosen - 1] is not None else f" (not recorded at epoch {chosen})"
        fig.update_xaxes(title_text="layer")
        fig.update_yaxes(title_text=name)
        return finish(fig, f"{name} per layer, epoch {chosen} in black{missing}", 420)
