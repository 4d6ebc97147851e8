"""SoT's head (Xie et al. 2022, § 3.2-3.3): the per-head cross-covariances and their spectra before
and after svPN (alpha slider), the branch logits of one image, and maps side by side (Fig. S-4)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ...analysis.saliency_result import SaliencyResult
from ...viz.overlay import opacity_slider, overlay_grid
from ...viz.style import MASK_SCALE, finish, log_axis, map_axes, palette, step_slider
from .analysis import HeadAnatomy

__all__ = ["branch_logits_figure", "cross_covariance_figure", "maps_grid", "svpn_spectrum_figure"]


def _check_image(anatomy: HeadAnatomy, image: int) -> None:
    if not 0 <= image < len(anatomy.cov):
        raise ValueError(f"image must be in 0..{len(anatomy.cov) - 1}; got {image}.")


def cross_covariance_figure(anatomy: HeadAnatomy, image: int = 0) -> go.Figure:
    """The h cross-covariance matrices Q_i (m x n) of one image, one panel per head, with each
    head's asymmetry ||Q - Q^T|| / ||Q|| (square Q) in its title."""
    _check_image(anatomy, image)
    cov = anatomy.cov[image].detach().float().cpu()
    titles = []
    for q in cov:
        asym = (q - q.T).norm() / q.norm() if q.shape[0] == q.shape[1] else float("nan")
        titles.append(f"head {len(titles)}<br>{asym:.2f}")
    fig = make_subplots(rows=1, cols=len(cov), subplot_titles=titles, horizontal_spacing=0.02)
    for i, q in enumerate(cov):
        fig.add_trace(go.Heatmap(z=q.numpy(), coloraxis="coloraxis"), row=1, col=i + 1)
    map_axes(fig)
    fig.update_layout(coloraxis={"colorscale": MASK_SCALE, "cmid": 0})
    title = (
        f"Per-head cross-covariance Q_i = (1/q) W_i Z Z^T R_i^T, image {image}<br><sup>under "
        "each head: its asymmetry ||Q_i - Q_i^T|| / ||Q_i||</sup>"
    )
    return finish(fig, title, 360)


def svpn_spectrum_figure(
    anatomy: HeadAnatomy,
    image: int = 0,
    alphas: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0),
) -> go.Figure:
    """Singular values of each head's Q (dots) and after exact svPN, lambda^alpha (solid), and
    the one-value approximation, lambda / lambda_hat_1^(1 - alpha) (dashed); log scale, a slider
    picks alpha. svPN flattens the spectrum; the approximation only rescales it."""
    _check_image(anatomy, image)
    before = anatomy.singular_values[image].float().cpu()
    heads, k = before.shape
    index = list(range(1, k + 1))
    fig = go.Figure()
    for alpha in alphas:
        curves = [("Q", before, "markers", None),
                  ("svPN", anatomy.svpn_values(alpha)[image], "lines", None),
                  ("approx", anatomy.approx_values(alpha)[image], "lines", "dash")]  # fmt: skip
        for h in range(heads):
            for label, values, mode, dash in curves:
                fig.add_trace(go.Scatter(
                    x=index, y=values[h].float().cpu().numpy(), mode=mode,
                    line={"color": palette(h), "dash": dash}, marker={"color": palette(h)},
                    name=f"head {h}: {label}", legendgroup=str(h),
                ))  # fmt: skip
    active = min(range(len(alphas)), key=lambda i: abs(alphas[i] - anatomy.alpha))
    step_slider(fig, [f"{a:g}" for a in alphas], 3 * heads, active, "alpha ")
    fig.update_xaxes(title_text="singular value index", dtick=1)
    log_axis(fig, "y", title_text="singular value")
    return finish(fig, f"Spectra before and after normalization, image {image}", 480)


def branch_logits_figure(
    anatomy: HeadAnatomy, image: int = 0, classes: Sequence[str] | None = None
) -> go.Figure:
    """The ClassT and WordT logits of one image per class, and the model's output."""
    _check_image(anatomy, image)
    parts = {"ClassT": anatomy.classt_logits, "WordT": anatomy.wordt_logits,
             "output": anatomy.logits}  # fmt: skip
    count = anatomy.logits.shape[1]
    labels = list(classes) if classes is not None else [str(c) for c in range(count)]
    fig = go.Figure()
    for i, (name, values) in enumerate(parts.items()):
        if values is not None:
            fig.add_trace(go.Bar(x=labels, y=values[image].float().cpu().numpy(), name=name,
                                 marker_color=palette(i)))  # fmt: skip
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="logit")
    return finish(fig, f"Logits of image {image} by branch", 360)


def maps_grid(
    images: np.ndarray,
    maps: Mapping[str, SaliencyResult],
    indices: Sequence[int],
    row_labels: Sequence[str] | None = None,
) -> go.Figure:
    """Maps of several methods (columns) on several images (rows) over the images, each map
    min-max scaled; signed maps (the exact WordT shares) are scaled the same way.

    Args:
        images: (B, H, W, 3) uint8 (`display_images`).
        maps: column title -> `SaliencyResult` on the same batch.
        indices: which images (rows).
    """
    if not indices:
        raise ValueError("indices is empty: pick at least one image.")
    for name, result in maps.items():
        if len(result.maps) != len(images):
            raise ValueError(f"{name} has {len(result.maps)} maps for {len(images)} images.")
    names = list(maps)
    labels = list(row_labels) if row_labels is not None else [f"image {i}" for i in indices]
    titles = [f"{labels[r]}: {n}" for r in range(len(indices)) for n in names]
    cells = [[(images[i], maps[name].maps[i]) for name in names] for i in indices]
    fig = overlay_grid(cells, subplot_titles=titles, horizontal_spacing=0.02,
                       vertical_spacing=0.06)  # fmt: skip
    fig.update_annotations(font_size=12)
    finish(opacity_slider(fig), "Maps side by side (each min-max scaled)", 230 * len(indices) + 80)
    return fig
