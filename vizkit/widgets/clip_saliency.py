"""The `SaliencyComparer` on a video model's clips: each method's maps of a clip, over the frame a
slider picks, every map min-max scaled over its whole clip (so frames compare). The metrics
score images' maps only, so a clip's maps come without scores."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from torch import Tensor, nn

from ..analysis import SaliencyResult
from ..hooks import Target
from ..hooks.video import VIDEO_ANALYSES
from ..methods.registry import METHODS, registered
from ..viz.overlay import opacity_slider, overlay_grid
from ..viz.saliency import PANELS_PER_ROW, _wrapped
from ..viz.style import MIN_FONT_SIZE, SALIENCY_SCALE, finish, min_max_scaled
from ..viz.video import clip_grid, map_frame

__all__ = ["NO_SCORES", "clip_maps", "clip_methods", "clips_figure", "frame_figure"]

NO_SCORES = "maps only: the metrics do not take clips yet"  # no scores, curves, sanity checks
COLORBAR = {"title": {"text": "min-max<br>over clip"}}


def clip_methods(methods: Sequence[str], named: bool) -> list[str]:
    """Of ``methods`` (registry names), those that take clips; where the user ``named`` them
    (not "all" or "default"), one that does not take clips is refused, naming those that do."""
    takes = [name for name, method in METHODS.items() if method.fn.__name__ in VIDEO_ANALYSES]
    unknown = [name for name in methods if name not in METHODS]
    if unknown:
        raise ValueError(f"Unknown saliency methods {unknown}; those that take clips: {takes}.")
    refused = [name for name in methods if name not in takes]
    if named and refused:
        raise ValueError(
            f"{refused} do not take clips yet (their maps have no frame axis); methods that "
            f"do: {takes}."
        )
    chosen = [name for name in methods if name in takes]
    if not chosen:
        raise ValueError(f"None of {list(methods)} takes clips; methods that do: {takes}.")
    return chosen


def clip_maps(
    model: nn.Module, x: Tensor, methods: Sequence[str], target: Target
) -> tuple[dict[str, SaliencyResult], dict[str, str]]:
    """Each method's maps of the clip ``x`` (1, T, C, H, W), and why those it could not make
    were left out (the method's ValueError), as `compare_saliency` notes them."""
    results, notes = {}, {}
    for name in methods:
        try:
            results[name] = registered(name)(model, x, target=target)
        except ValueError as error:
            notes[name] = str(error)
    return results, notes


def _scaled(result: SaliencyResult) -> Tensor:
    """The clip's maps (T', h, w) min-max scaled over the whole clip."""
    return min_max_scaled(result.maps[0])


def _panel(name: str, result: SaliencyResult, frame: int, count: int) -> str:
    """A method's panel title: its name, and input frame ``frame``'s share of the clip's |map|
    (its map frame's over the ``count`` // T' frames that frame spans, as `video_saliency`), or
    that the map is constant (it ranks no pixel)."""
    maps = result.maps[0]
    if bool((maps == maps.flatten()[0]).all()):
        return f"<b>{_wrapped(name)}</b><br>constant map"
    share = result.frame_shares()[0, map_frame(frame, count, len(maps))].item()
    return f"<b>{_wrapped(name)}</b><br>{share * len(maps) / count:.0%} of |map|"


def frame_figure(
    clip: np.ndarray, results: dict[str, SaliencyResult], frame: int, title: str, per_row: int
) -> go.Figure:
    """The methods' maps over frame ``frame`` of ``clip`` (T, H, W, 3 uint8) side by side,
    ``per_row`` to a row (at most `PANELS_PER_ROW`), each map min-max scaled over its clip; each
    panel gives its map frame's share of the clip's |map|."""
    columns = max(1, min(len(results), per_row, PANELS_PER_ROW))
    names = list(results)
    rows = [names[i : i + columns] for i in range(0, len(names), columns)]
    at = {n: map_frame(frame, len(clip), len(r.maps[0])) for n, r in results.items()}
    cells = [[(clip[frame], _scaled(results[n])[at[n]]) for n in row] for row in rows]
    titles = [_panel(n, results[n], frame, len(clip)) for n in names]
    fig = overlay_grid(cells, scaled=False, subplot_titles=titles, horizontal_spacing=0.02,
                       vertical_spacing=0.35 / len(rows))  # fmt: skip
    fig.update_layout(coloraxis_colorbar=COLORBAR)
    fig.update_annotations(font_size=MIN_FONT_SIZE)
    opacity_slider(fig)
    return finish(fig, title, 420 + 260 * (len(rows) - 1))


def clips_figure(clip: np.ndarray, results: dict[str, SaliencyResult], title: str) -> go.Figure:
    """Every method's maps over every frame of ``clip`` (T, H, W, 3 uint8): a method's frames
    side by side, one method after another, each min-max scaled over its clip; the method's
    name over its first frame."""
    titles = [f"<b>{_wrapped(name)}</b><br>" * (t == 0) + f"frame {t}"
              for name in results for t in range(len(clip))]  # fmt: skip
    coloraxis = {"colorscale": SALIENCY_SCALE, "cmin": 0, "cmax": 1, "colorbar": COLORBAR}
    fig = clip_grid(clip, [_scaled(r) for r in results.values()], titles, coloraxis)
    return finish(fig, title)
