"""Figures of the mechanistic views: direct logit attribution by part and by head, the logit
lens over the patches per layer, and activation patching as layer x position and layer x head
maps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from ..analysis.logit_attribution import LogitAttribution
from ..analysis.logit_lens import LogitLens
from ..analysis.patching import PatchingResult
from .overlay import photo
from .style import SALIENCY_SCALE, finish, map_axes, square_cells, step_slider

__all__ = ["logit_attribution_figure", "logit_lens_maps", "patching_maps"]

DIVERGING = "RdBu"  # signed contributions: red lowers, blue raises the score; white is 0


def _images(index: int | None, batch: int) -> tuple[slice, str]:
    """The images a figure averages over, and how its title says so."""
    if index is None:
        return slice(None), f"mean over {batch} images"
    if not 0 <= index < batch:
        raise IndexError(f"image must be in [0, {batch}); got {index}.")
    return slice(index, index + 1), f"image {index}"


def _class(index: int, classes: Sequence[str] | None) -> str:
    return classes[index] if classes is not None else f"class {index}"


def _score_name(
    targets: torch.Tensor, versus: torch.Tensor | None, images: slice,
    classes: Sequence[str] | None,
) -> str:  # fmt: skip
    chosen = sorted(set(targets[images].tolist()))
    name = (f"logit of {_class(chosen[0], classes)}" if len(chosen) == 1
            else "logit of the class explained")  # fmt: skip
    if versus is not None:
        others = sorted(set(versus[images].tolist()))
        name += f" − {_class(others[0], classes)}" if len(others) == 1 else " − the versus class"
    return name


def _symmetric(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0


def logit_attribution_figure(
    result: LogitAttribution, image: int | None = None, classes: Sequence[str] | None = None
) -> go.Figure:
    """Each part's direct contribution as bars (embedding, then each block's attention and MLP
    outputs) and, where the heads split, each head's as a layer x head map; one image or the
    mean over the batch; ``classes`` name the classes."""
    chosen, over = _images(image, len(result.score))
    values = result.contributions[chosen].mean(0).cpu().numpy()
    heads = result.heads is not None
    fig = make_subplots(
        rows=1, cols=2 if heads else 1, column_widths=[0.6, 0.4] if heads else None,
        subplot_titles=["each part of the stream", "each head (its share of attn)"][: 1 + heads],
        horizontal_spacing=0.12,
    )  # fmt: skip
    colours = ["#7f7f7f"] + ["#1f77b4" if "attn" in p else "#ff7f0e" for p in result.parts[1:]]
    fig.add_trace(
        go.Bar(x=result.parts, y=values, marker_color=colours, showlegend=False,
               hovertemplate="%{x}: %{y:.3f}<extra></extra>"),
        row=1, col=1,
    )  # fmt: skip
    fig.update_yaxes(title_text="direct contribution", row=1, col=1)
    fig.update_xaxes(tickangle=-45, row=1, col=1)
    if heads:
        grid = result.heads[chosen].mean(0).cpu().numpy()  # (L, H)
        top = _symmetric(grid)
        fig.add_trace(
            go.Heatmap(
                z=grid, x=[f"head {h}" for h in range(grid.shape[1])], y=result.blocks,
                colorscale=DIVERGING, zmid=0, zmin=-top, zmax=top,
                colorbar={"title": "direct<br>contribution", "x": 1.02},
                hovertemplate="%{y}, %{x}: %{z:.3f}<extra></extra>",
            ),
            row=1, col=2,
        )  # fmt: skip
        fig.update_yaxes(autorange="reversed", row=1, col=2)
        square_cells(fig)
    score = float(result.score[chosen].mean())
    constant = float(result.constant[chosen].mean())
    explained = _score_name(result.targets, result.versus, chosen, classes)
    title = (
        f"Direct logit attribution, {over}: {explained} = {score:.3f}<br><sup>parts sum to "
        f"it with the head's constant {constant:.3f}; the final norm's scale frozen at its "
        "clean value</sup>"
    )
    return finish(fig, title, 460)


def logit_lens_maps(
    lens: LogitLens, images: np.ndarray, image: int = 0, target: int | None = None,
    classes: Sequence[str] | None = None, layer: int | None = None,
) -> go.Figure:  # fmt: skip
    """The probability of ``target`` (default: the model's class) read off each patch after
    each layer, one layer at a time on a slider, the image (B, H, W, 3) uint8 beside it; the
    slider names each layer with the pooled reading's probability; ``classes`` name the
    classes; ``layer`` (an index of ``lens.layers``): that layer alone, without a slider."""
    _, over = _images(image, len(lens.predictions))
    cls = int(lens.predictions[image]) if target is None else int(target)
    maps = lens.maps(cls)[image].cpu().numpy()  # (L + 1, gh, gw)
    pooled = lens.pooled[image].softmax(-1)[:, cls].cpu().numpy()
    fig = make_subplots(rows=1, cols=2, subplot_titles=["image", "per patch"],
                        horizontal_spacing=0.05)  # fmt: skip
    shown = range(len(lens.layers)) if layer is None else [layer]
    for index in shown:
        name = lens.layers[index]
        fig.add_trace(photo(images[image], hoverinfo="skip"), row=1, col=1)
        fig.add_trace(
            go.Heatmap(
                z=maps[index], coloraxis="coloraxis",
                hovertemplate=f"{name}, patch (row %{{y}}, col %{{x}}): %{{z:.3f}}<extra></extra>",
            ),
            row=1, col=2,
        )  # fmt: skip
    labels = [f"{name} (pooled {p:.2f})" for name, p in zip(lens.layers, pooled, strict=True)]
    if layer is None:
        step_slider(fig, labels, per_step=2, active=len(lens.layers) - 1, prefix="after ")
    else:
        fig.layout.annotations[1].text = f"per patch after {labels[layer]}"
    map_axes(fig)
    fig.update_layout(coloraxis={"colorscale": SALIENCY_SCALE, "cmin": 0, "cmax": 1,
                                 "colorbar": {"title": f"p({_class(cls, classes)})"}})  # fmt: skip
    first = int(lens.first_decodable()[image])
    title = (
        f"Logit lens, {over}: the head on each patch, probability of {_class(cls, classes)}"
        f"<br><sup>the pooled reading settles on the model's class after "
        f"{lens.layers[first]}</sup>"
    )
    return finish(fig, title, 520)


def patching_maps(result: PatchingResult, image: int | None = None) -> go.Figure:
    """The restored share of the clean score per patched site: the stream entering each block
    per position (layers x positions), the embedded tokens (the first block's, per position),
    each head (layers x heads), each block's attention and MLP output (bars); one image or the
    mean over the batch."""
    chosen, over = _images(image, len(result.clean_score))
    high = result.clean_score[chosen].mean()
    low = result.corrupted_score[chosen].mean()

    def restored(site: str) -> Tensor | None:  # the share of the mean scores (a mean of
        if getattr(result, site) is None:  # per-image shares is ruled by the smallest gaps)
            return None
        share = (result.scores[site][chosen].mean(0) - low) / (high - low)
        return share[None, None] if site == "positions" else share[None]  # one block's row

    panels = [(name, restored(name)) for name in ("resid", "positions", "heads")]
    panels = [(n, v) for n, v in panels if v is not None]
    bars = [(n, restored(n)) for n in ("attn", "mlp") if getattr(result, n) is not None]
    titles = {
        "resid": "stream entering each block, per position",
        "positions": "embedded tokens, per position",
        "heads": "each head's output",
    }
    cols = len(panels) + bool(bars)
    if not cols:
        raise ValueError("The result holds no patched site.")
    fig = make_subplots(rows=1, cols=cols, horizontal_spacing=0.1,
                        subplot_titles=[titles[n] for n, _ in panels]
                        + ["each block's output"] * bool(bars))  # fmt: skip
    for col, (name, values) in enumerate(panels, start=1):
        grid = values[0].cpu().numpy()
        tokens = name != "heads"
        prefix = result.layout.num_prefix_tokens if result.layout and tokens else 0
        x = ([f"prefix {p}" for p in range(prefix)]
             + [f"patch {p}" for p in range(grid.shape[1] - prefix)]) if tokens else [
            f"head {h}" for h in range(grid.shape[1])]  # fmt: skip
        rows = result.blocks[:1] if name == "positions" else result.blocks
        fig.add_trace(
            go.Heatmap(z=grid, x=x, y=rows, coloraxis="coloraxis",
                       hovertemplate="%{y}, %{x}: %{z:.3f}<extra></extra>"),
            row=1, col=col,
        )  # fmt: skip
        fig.update_yaxes(autorange="reversed", row=1, col=col)
        fig.update_xaxes(showticklabels=name == "heads", row=1, col=col)
        if name == "heads":  # square cells (a layer x position strip stays wide)
            fig.update_yaxes(scaleanchor=f"x{col if col > 1 else ''}", constrain="domain",
                             row=1, col=col)  # fmt: skip
            fig.update_xaxes(constrain="domain", row=1, col=col)
    for name, values in bars:
        fig.add_trace(
            go.Bar(x=result.blocks, y=values[0].cpu().numpy(), name=name,
                   hovertemplate=f"{name} %{{x}}: %{{y:.3f}}<extra></extra>"),
            row=1, col=cols,
        )  # fmt: skip
    if bars:
        fig.update_yaxes(title_text="restored share", row=1, col=cols)
    fig.update_layout(coloraxis={"colorscale": DIVERGING, "cmid": 0,
                                 "colorbar": {"title": "restored<br>share"}},
                      barmode="group", legend={"orientation": "h", "y": -0.2})  # fmt: skip
    title = (
        f"Activation patching, {over}: share of the clean score restored"
        f"<br><sup>(patched − corrupted) / (clean − corrupted) of the mean scores; clean − "
        f"corrupted = {float(high - low):.3f}; 1: that activation alone restores it</sup>"
    )
    return finish(fig, title, 480)
