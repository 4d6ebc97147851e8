"""Learned attention masks (GMM paper): the N x N mask and its rows folded onto the patch grid
(Fig. 3), radial profiles and a Gaussian fit (Fig. 4), GMM parameters over training, accuracy
against the number of kernels (Fig. 6) and the attention each patch receives (Fig. 7)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from ...viz.overlay import overlay_grid
from ...viz.style import MASK_SCALE, finish, log_axis, map_axes, palette, square_cells, step_slider
from .analysis import GaussianFit, radial_profile
from .attention_masks import PAPER_EPS, grid_square_distances

__all__ = [
    "accuracy_vs_kernels_figure",
    "folded_mask",
    "gaussian_fit_figure",
    "gmm_parameters_figure",
    "mask_figure",
    "mask_evolution_figure",
    "mask_layers_figure",
    "masks_as_kernels_figure",
    "radial_profiles_figure",
    "received_attention_figure",
]


def mask_figure(
    mask: Tensor, grid: tuple[int, int], query: tuple[int, int] | None = None, title: str = ""
) -> go.Figure:
    """A patch-to-patch mask (Np, Np) as a heatmap (left) and the row of one query patch
    reshaped onto the (gh, gw) grid (right; default the centre patch).

    Args:
        mask: (Np, Np) over the patch tokens, row = query, column = key.
        grid: (gh, gw) with gh * gw = Np.
    """
    gh, gw = grid
    if mask.ndim != 2 or mask.shape != (gh * gw, gh * gw):
        raise ValueError(
            f"mask must be (Np, Np) = ({gh * gw}, {gh * gw}) for a {gh}x{gw} grid; got "
            f"{tuple(mask.shape)}."
        )
    r, c = query if query is not None else (gh // 2, gw // 2)
    if not (0 <= r < gh and 0 <= c < gw):
        raise ValueError(f"query {query} is outside the {gh}x{gw} grid.")
    values = mask.detach().float().cpu()
    kernel = values[r * gw + c].reshape(gh, gw)
    titles = ["mask M (query patch x key patch)", f"row of query patch ({r}, {c}) on the grid"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles)
    fig.add_trace(go.Heatmap(z=values.numpy(), coloraxis="coloraxis"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=kernel.numpy(), coloraxis="coloraxis"), row=1, col=2)
    fig.add_trace(
        go.Scatter(x=[c], y=[r], mode="markers", marker={"symbol": "x", "color": "black"},
                   name="query", showlegend=False),
        row=1, col=2,
    )  # fmt: skip
    fig.update_yaxes(autorange="reversed")
    square_cells(fig)
    fig.update_layout(coloraxis={"colorscale": MASK_SCALE, "cmid": 0})
    return finish(fig, title or "Learned attention mask", 430)


def masks_as_kernels_figure(masks: Mapping[str, Tensor], grid: tuple[int, int]) -> go.Figure:
    """The paper's Fig. 2, RetNet viewed through convolution: each mask (Np, Np) over the patch
    grid (top) and the kernel its row at the centre patch is, folded onto the (gh, gw) grid
    (bottom), side by side for several masks (``masks``: name -> its first head's mask). Each
    panel is min-max scaled: the masks differ in scale and sign, the shapes are compared."""
    gh, gw = grid
    centre = (gh // 2) * gw + gw // 2
    for name, mask in masks.items():
        if mask.shape != (gh * gw, gh * gw):
            raise ValueError(
                f"mask {name!r} must be ({gh * gw}, {gh * gw}); got {tuple(mask.shape)}."
            )
    fig = make_subplots(rows=2, cols=len(masks), subplot_titles=list(masks),
                        vertical_spacing=0.08, horizontal_spacing=0.03)  # fmt: skip
    for col, mask in enumerate(masks.values(), start=1):
        values = mask.detach().float().cpu()
        span = (values.max() - values.min()).clamp_min(1e-12)
        scaled = (values - values.min()) / span
        kernel = scaled[centre].view(gh, gw)
        for row, z, hover in ((1, scaled, "query %{y}, key %{x}"),
                              (2, kernel, "patch (row %{y}, col %{x})")):  # fmt: skip
            fig.add_trace(go.Heatmap(z=z.numpy(), coloraxis="coloraxis",
                                     hovertemplate=f"{hover}: %{{z:.3f}}<extra></extra>"),
                          row=row, col=col)  # fmt: skip
    map_axes(fig)
    fig.update_layout(coloraxis={"colorscale": "viridis", "cmin": 0, "cmax": 1,
                                 "colorbar": {"title": "min-max<br>per panel"}})  # fmt: skip
    title = (
        "Masks as convolutions (Fig. 2): each mask over the patches (top) and its row at the "
        f"centre patch on the {gh} x {gw} grid (bottom), the kernel it applies"
    )
    return finish(fig, title, 560)


def folded_mask(mask: Tensor, grid: tuple[int, int]) -> Tensor:
    """Fig. 3 (right): each query patch's row (gh, gw) placed at that patch's position, with
    one-pixel NaN gutters: (Np, Np) -> (gh * (gh + 1) - 1, gw * (gw + 1) - 1)."""
    gh, gw = grid
    rows = mask.detach().float().cpu().reshape(gh, gw, gh, gw)  # query r, c; key r, c
    padded = torch.full((gh, gw, gh + 1, gw + 1), float("nan"))
    padded[:, :, :gh, :gw] = rows
    mosaic = padded.permute(0, 2, 1, 3).reshape(gh * (gh + 1), gw * (gw + 1))
    return mosaic[:-1, :-1]


def _zscore(values: Tensor) -> Tensor:
    values = values.detach().float().cpu()
    return (values - values.mean()) / values.std().clamp_min(1e-12)


def mask_layers_figure(
    masks: Mapping[str, Tensor], grid: tuple[int, int], title: str = "Learned masks"
) -> go.Figure:
    """Fig. 3 for every layer: the (Np, Np) mask (top) and its rows folded onto the grid
    (bottom), each z-scored per layer as the paper's display (``masks``: label -> (Np, Np))."""
    labels = list(masks)
    fig = make_subplots(rows=2, cols=len(labels), column_titles=labels,
                        row_titles=["mask (query x key)", "rows on the grid"],
                        horizontal_spacing=0.02, vertical_spacing=0.04)  # fmt: skip
    for col, label in enumerate(labels, start=1):
        z = _zscore(masks[label])
        fig.add_trace(go.Heatmap(z=z.numpy(), coloraxis="coloraxis"), row=1, col=col)
        fig.add_trace(go.Heatmap(z=folded_mask(z, grid).numpy(), coloraxis="coloraxis"),
                      row=2, col=col)  # fmt: skip
    map_axes(fig)
    fig.update_layout(coloraxis={"colorscale": MASK_SCALE, "cmid": 0,
                                 "colorbar": {"title": "z-score"}})  # fmt: skip
    return finish(fig, title, 560)


def radial_profiles_figure(
    masks: Mapping[str, Tensor] | Mapping[str, Mapping[str, Tensor]],
    grid: tuple[int, int],
    title: str = "Mask against distance",
) -> go.Figure:
    """The mean mask value at each patch distance, one curve per label (``masks``: label ->
    (Np, Np) or (Hm, Np, Np), heads averaged). A mapping of such mappings (e.g. ``{"ELM-ViT":
    {...}, "GMM-ViT": {...}}``) gives one panel per group, each with its own y axis, so masks of
    different scales are not flattened against each other."""
    groups = masks if all(isinstance(v, Mapping) for v in masks.values()) else {"": masks}
    fig = make_subplots(rows=1, cols=len(groups), subplot_titles=[g for g in groups if g] or None,
                        horizontal_spacing=0.08)  # fmt: skip
    shown: set[str] = set()  # one legend entry per label, shared by the panels
    for col, group in enumerate(groups.values(), start=1):
        for i, (label, mask) in enumerate(group.items()):
            distance, profile = radial_profile(mask, grid)
            values = profile.reshape(-1, len(distance)).mean(0)
            fig.add_trace(go.Scatter(x=distance.tolist(), y=values.tolist(), mode="lines+markers",
                                     name=label, line={"color": palette(i)}, legendgroup=label,
                                     showlegend=label not in shown), row=1, col=col)  # fmt: skip
            shown.add(label)
        fig.update_yaxes(title_text="mean mask value", row=1, col=col)
    fig.update_xaxes(title_text="distance between patches")
    return finish(fig, title, 380)


def gaussian_fit_figure(mask: Tensor, fit: GaussianFit, grid: tuple[int, int], title: str = ""):
    """Fig. 4: every entry of a mask against its patch distance, the fitted mixture and each of
    its Gaussians alpha_k exp(-d^2 / (2 sigma_k^2))."""
    distance, _ = radial_profile(mask, grid)
    pair = grid_square_distances(grid).sqrt().flatten().numpy()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=pair, y=mask.detach().float().cpu().numpy().ravel(),
                             mode="markers", name="mask entries",
                             marker={"size": 3, "color": "#bdbdbd"}))  # fmt: skip
    d = torch.linspace(0, float(distance.max()), 200)
    fitted = torch.zeros_like(d)
    for k, (a, s) in enumerate(zip(fit.alpha.tolist(), fit.sigma.tolist(), strict=True)):
        component = a * torch.exp(-(d**2) / (2 * s**2 + PAPER_EPS))
        fitted += component
        fig.add_trace(go.Scatter(x=d.tolist(), y=component.tolist(), mode="lines",
                                 name=f"alpha {a:.2f}, sigma {s:.2f}",
                                 line={"dash": "dot", "color": palette(k + 1)}))  # fmt: skip
    fig.add_trace(go.Scatter(x=d.tolist(), y=fitted.tolist(), mode="lines",
                             name=f"mixture (R^2 {fit.r2:.3f})",
                             line={"color": palette(0), "width": 3}))  # fmt: skip
    fig.update_xaxes(title_text="distance between patches")
    fig.update_yaxes(title_text="mask value")
    return finish(fig, title or f"A {len(fit.alpha)}-Gaussian fit of the mask (GMM Fig. 4)", 400)


def gmm_parameters_figure(history: Sequence[dict], title: str = "") -> go.Figure:
    """Every Gaussian (alpha against |sigma|, one colour per layer, one marker per kernel and
    head) at each epoch of a training history whose records hold ``masks`` (the "masks"
    tracker); a slider picks the epoch."""
    epochs = [r for r in history if isinstance(r.get("masks"), dict) and r["masks"]]
    first = next(iter(epochs[0]["masks"].values())) if epochs else None
    if first is None or "alpha" not in first:
        raise ValueError(
            "The history holds no GMM parameters: train a vizkit_gmm_vit_* model with "
            'track ["masks"] (the zoo\'s masks_gmm_* cards have them).'
        )
    fig = go.Figure()
    for record in epochs:
        for i, (layer, p) in enumerate(record["masks"].items()):
            alpha, sigma = np.array(p["alpha"]), np.abs(np.array(p["sigma"]))
            k, h = np.indices(alpha.shape)
            fig.add_trace(go.Scatter(
                x=sigma.ravel(), y=alpha.ravel(), mode="markers", name=layer,
                marker={"color": palette(i), "size": 8},
                text=[f"{layer} kernel {a} head {b}" for a, b in zip(k.ravel(), h.ravel(),
                                                                     strict=True)],
                hovertemplate="%{text}<br>sigma %{x:.3g}, alpha %{y:.3g}<extra></extra>",
            ))  # fmt: skip
    labels = [str(record["epoch"]) for record in epochs]
    step_slider(fig, labels, len(epochs[0]["masks"]), len(epochs) - 1, "epoch ")
    fig.add_hline(y=0, line_dash="dot")
    log_axis(fig, "x", title_text="|sigma| (patches)")
    fig.update_yaxes(title_text="alpha")
    return finish(fig, title or "GMM kernels per layer over training", 480)


def accuracy_vs_kernels_figure(
    ours: Mapping[int, dict], paper: Mapping[int, float] | None = None, title: str = ""
) -> go.Figure:
    """Fig. 6: test accuracy against the number of Gaussian kernels K (0: the vanilla model).
    ``ours`` maps K to `vizkit.ledger.accuracy_over_seeds(prefix)` (mean, sample-std bars and
    each seed); ``paper`` (K -> accuracy, e.g. its CIFAR-100 curve) on the right axis."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    ks = sorted(ours)
    fig.add_trace(go.Scatter(
        x=ks, y=[ours[k]["mean"] for k in ks], mode="lines+markers", name="ours (mean, std)",
        error_y={"type": "data", "array": [ours[k]["std"] for k in ks]},
        line={"color": palette(0)},
    ))  # fmt: skip
    for k in ks:
        fig.add_trace(go.Scatter(x=[k] * len(ours[k]["accuracies"]), y=ours[k]["accuracies"],
                                 mode="markers", showlegend=False,
                                 marker={"color": palette(0), "opacity": 0.4}))  # fmt: skip
    if paper:
        fig.add_trace(go.Scatter(x=list(paper), y=list(paper.values()), mode="lines+markers",
                                 name="paper", line={"color": palette(1), "dash": "dash"}),
                      secondary_y=True)  # fmt: skip
        fig.update_yaxes(title_text="paper top-1 (%)", secondary_y=True)
    fig.update_xaxes(title_text="kernels K (0: no mask)", dtick=1)
    fig.update_yaxes(title_text="our test top-1 (%)", tickformat=".1%", secondary_y=False)
    if paper:
        fig.update_yaxes(tickformat=".1f", secondary_y=True)  # the paper's percent, as printed
    return finish(fig, title or "Accuracy against the number of Gaussians (GMM Fig. 6)", 400)


def received_attention_figure(
    images: np.ndarray, maps: Mapping[str, Tensor], count: int = 4, title: str = ""
) -> go.Figure:
    """Fig. 7: each image (rows) with the attention its patches receive in each model
    (columns; ``maps``: label -> (B, gh, gw), e.g. ``attention(...).received()[-1]``),
    min-max scaled per map."""
    shown = min(count, len(images))
    labels = list(maps)
    cells = [[(images[row], None)] + [(images[row], maps[label][row]) for label in labels]
             for row in range(shown)]  # fmt: skip
    fig = overlay_grid(cells, column_titles=["image", *labels], horizontal_spacing=0.01,
                       vertical_spacing=0.02)  # fmt: skip
    height = max(300, math.ceil(170 * shown) + 80)
    return finish(fig, title or "Attention each patch receives, last block (GMM Fig. 7)", height)


def mask_evolution_figure(
    masks_by_epoch: Mapping[int, Tensor],
    grid: tuple[int, int],
    query: tuple[int, int] | None = None,
    title: str = "",
) -> go.Figure:
    """One layer's mask over training: the row of one query patch (default the centre) on the
    grid, one panel per head; a slider picks the epoch (``masks_by_epoch``: epoch ->
    (Hm, Np, Np), e.g. `gmm_masks_over_training(...)[layer]`). Shared colours over epochs."""
    gh, gw = grid
    r, c = query if query is not None else (gh // 2, gw // 2)
    if not (0 <= r < gh and 0 <= c < gw):
        raise ValueError(f"query {query} is outside the {gh}x{gw} grid.")
    epochs = list(masks_by_epoch)
    heads = next(iter(masks_by_epoch.values())).shape[0]
    fig = make_subplots(rows=1, cols=heads, subplot_titles=[f"head {h}" for h in range(heads)],
                        horizontal_spacing=0.02)  # fmt: skip
    for epoch in epochs:
        rows = masks_by_epoch[epoch][:, r * gw + c].reshape(heads, gh, gw).float().cpu()
        for h in range(heads):
            fig.add_trace(go.Heatmap(z=rows[h].numpy(), coloraxis="coloraxis",
                                     name=f"epoch {epoch}"),
                          row=1, col=h + 1)  # fmt: skip
    step_slider(fig, [str(e) for e in epochs], heads, len(epochs) - 1, "epoch ")
    fig.update_layout(coloraxis={"colorscale": MASK_SCALE, "cmid": 0})
    map_axes(fig)
    default = f"The mask row of query patch ({r}, {c}) over training"
    return finish(fig, title or default, 360)
