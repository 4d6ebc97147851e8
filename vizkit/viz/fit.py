"""Fit a figure's text to the width it is drawn at: plotly neither wraps nor shrinks text, so a
long title runs out of the figure or under the mode bar, and subplot titles run into each
other when their panels narrow. Sizes of text are estimated from character counts, with mean
glyph widths on the wide side (checked in a browser by `tests/test_explorers_in_lab.py`).
"""

from __future__ import annotations

import math
import re

import plotly.graph_objects as go

from .style import MIN_FONT_SIZE

__all__ = ["fit_annotations", "fit_legend", "fit_text", "fit_title"]

# mean glyph widths, px: plotly's 17 px title font, its <sup> subtitle (about 70 % of it), and
# any other font per px of its size (bold a little wider)
TITLE_CHARACTER_PX, SUBTITLE_CHARACTER_PX, CHARACTER_PER_FONT_PX = 8.6, 6.1, 0.56
TITLE_LINE_PX = 22  # the height a title line adds
MODEBAR_PX = 260  # the mode bar's width at the top right: a title beside it stops short of it
MODEBAR_BAND_PX = 26  # below a width where a title cannot stop short of it, it goes under it
NARROW_PX = 700
TITLE_PAD_PX = 28  # from the figure's top to the title's anchor (its text rises above that)
MIN_ANNOTATION_FONT_PX = MIN_FONT_SIZE  # the smallest legible text; below it, text wraps
COLORBAR_PX = 110  # a vertical colour bar right of the plots, its ticks and title
LEGEND_ROW_PX, LEGEND_BELOW_PX = 24, 60  # a horizontal legend's rows; its top under the plots


def fit_text(fig: go.Figure, width: float) -> go.Figure:
    """`fit_title`, `fit_legend` and `fit_annotations` for a figure ``width`` px wide."""
    return fit_annotations(fit_legend(fit_title(fig, width), width), width)


def fit_legend(fig: go.Figure, width: float) -> go.Figure:
    """A vertical legend right of the plots that would take more than a third of ``width``
    goes under the plots, horizontal, the bottom margin (and height) grown for its rows."""
    taken = _legend_at_right(fig)
    if not taken or taken <= width / 3:
        return fig
    named = [t.name or "" for t in fig.data if "showlegend" in t and t.showlegend is not False]
    per_row = max(1, int((width - 60) // taken))
    rows = -(-len(named) // per_row)
    added = LEGEND_ROW_PX * rows + 20
    plot_height = (fig.layout.height or 450) - (fig.layout.margin.t or 80)
    plot_height -= fig.layout.margin.b or 80
    fig.layout.legend.update(orientation="h", x=0, xanchor="left", yanchor="top",
                             y=-LEGEND_BELOW_PX / max(plot_height, 1))  # fmt: skip
    fig.layout.margin.b = (fig.layout.margin.b or 80) + added
    if fig.layout.height:
        fig.layout.height += added
    return fig


def fit_title(fig: go.Figure, width: float = 450) -> go.Figure:
    """Wrap the title's lines at word boundaries to fit a ``width`` px figure (450: a
    notebook's output area beside JupyterLab's file browser) left of the mode bar, or under it
    where the figure is narrower than 700 px; it hangs from the top, with a top margin (and
    height) for each line added."""
    text = fig.layout.title.text or ""
    if not text:
        return fig
    narrow = width < NARROW_PX
    room = width - 20 - (0 if narrow else MODEBAR_PX)
    wrapped = [
        "<br>".join(f"<sup>{w}</sup>" for w in _wrap(line[5:-6], room / SUBTITLE_CHARACTER_PX))
        if line.startswith("<sup>") and line.endswith("</sup>")
        else "<br>".join(_wrap(line, room / TITLE_CHARACTER_PX))
        for line in text.split("<br>")
    ]  # fmt: skip
    added = TITLE_LINE_PX * sum(w.count("<br>") for w in wrapped) + MODEBAR_BAND_PX * narrow
    fig.layout.title.update(text="<br>".join(wrapped), yref="container", y=1, yanchor="top",
                            pad={"t": TITLE_PAD_PX + MODEBAR_BAND_PX * narrow})  # fmt: skip
    if added:
        fig.layout.margin.t = (fig.layout.margin.t or 80) + added
        if fig.layout.height:
            fig.layout.height += added
    return fig


def fit_annotations(fig: go.Figure, width: float) -> go.Figure:
    """Annotations placed on the page (subplot titles, captions) fit their room: each of a row
    (one height) the gaps to its neighbours, its font shrunk to fit (down to 12 px, then wrapped,
    the top margin grown where the top row rises); a lone one below the plots is wrapped to the
    plot's width, the bottom margin grown for its lines. x axis titles shrink to their axis."""
    margin = fig.layout.margin
    plot = width - (80 if margin.l is None else margin.l) - (80 if margin.r is None else margin.r)
    plot -= COLORBAR_PX * _colorbar_at_right(fig) + _legend_at_right(fig)  # margins grow
    _fit_axis_titles(fig, plot)
    notes = [a for a in fig.layout.annotations
             if a.text and a.xref == "paper" and a.yref == "paper" and not a.textangle]  # fmt: skip
    rows: dict[float, list] = {}
    for note in notes:
        rows.setdefault(round(note.y or 0, 3), []).append(note)
    default_size = fig.layout.font.size or 12
    for row in rows.values():
        rising = 0  # px the row's wrapped titles rise by
        for note in row:
            size = note.font.size or default_size
            room = plot * _room(note, [n.x or 0 for n in row if n is not note]) - 12
            need = _longest(note.text) * size * CHARACTER_PER_FONT_PX
            if need <= room:
                continue
            if len(row) == 1 and (note.y or 0) < 0:
                _wrap_below(fig, note, room / (size * CHARACTER_PER_FONT_PX), size)
            else:
                note.font.size = max(MIN_ANNOTATION_FONT_PX, math.floor(size * room / need))
                if need * note.font.size / size > room:  # too long even at the floor: wrapped
                    characters = room / (note.font.size * CHARACTER_PER_FONT_PX)
                    rising = max(rising, _wrap_above(note, characters))
        if rising and (row[0].y or 0) >= 1:  # the top row's titles rise into the margin
            fig.layout.margin.t = (fig.layout.margin.t or 80) + rising
            if fig.layout.height:
                fig.layout.height += rising
    return fig


def _fit_axis_titles(fig: go.Figure, plot: float) -> None:
    """Shrink each x axis title to its axis' width (``plot`` px for the whole paper), down to
    12 px, then wrap it."""
    for name in [k for k in fig.layout.to_plotly_json() if k.startswith("xaxis")]:
        axis = fig.layout[name]
        if not axis.title.text:
            continue
        low, high = axis.domain or (0, 1)
        size = axis.title.font.size or 14
        need = _longest(axis.title.text) * size * CHARACTER_PER_FONT_PX
        room = (high - low) * plot - 8
        if need > room:
            axis.title.font.size = max(MIN_ANNOTATION_FONT_PX, math.floor(size * room / need))
            if need * axis.title.font.size / size > room:  # too long at the floor: wrapped
                characters = room / (axis.title.font.size * CHARACTER_PER_FONT_PX)
                lines = [
                    p for line in axis.title.text.split("<br>") for p in _wrap(line, characters)
                ]
                axis.title.text = "<br>".join(lines)


def _legend_at_right(fig: go.Figure) -> float:
    """The px a vertical legend right of the plots takes (plotly's default place), else 0."""
    legend = fig.layout.legend
    named = [t.name or "" for t in fig.data if "showlegend" in t and t.showlegend is not False]
    shown = fig.layout.showlegend if fig.layout.showlegend is not None else len(named) > 1
    if not shown or legend.orientation == "h" or (legend.x is not None and legend.x < 1):
        return 0
    return max(map(len, named), default=0) * 7 + 50


def _colorbar_at_right(fig: go.Figure) -> bool:
    """Whether a vertical colour bar stands right of the plots (plotly's default place)."""
    used = {t.coloraxis for t in fig.data if "coloraxis" in t and t.coloraxis}
    bars = [fig.layout[name] for name in used]
    bars += [t for t in fig.data if "showscale" in t and not ("coloraxis" in t and t.coloraxis)
             and t.type != "scatter"]  # fmt: skip
    return any(
        bar.showscale is not False
        and (bar.colorbar.orientation or "v") == "v"
        and (bar.colorbar.x is None or bar.colorbar.x >= 1)
        for bar in bars
    )


def _room(note, others: list[float]) -> float:
    """The paper width ``note`` may take: up to halfway to its neighbours in its row (each side
    as its anchor needs), else to the plot's edges."""
    x, anchor = note.x or 0, note.xanchor or "center"
    left = min([x - o for o in others if o < x] or [x * (2 if others else 1)])
    right = min([o - x for o in others if o > x] or [(1 - x) * (2 if others else 1)])
    if anchor == "left":
        return right
    if anchor == "right":
        return left
    return 2 * min(left, right) / (2 if others else 1)


def _longest(text: str) -> float:
    """The longest line of ``text`` in characters, tags aside (bold counted 10 % wider)."""
    lines = text.split("<br>")
    return max(len(re.sub(r"<[^>]+>", "", line)) * (1.1 if "<b>" in line else 1) for line in lines)


def _wrap_above(note, characters: float) -> int:
    """Wrap each line of ``note`` (a subplot title, rising from its place) into lines of
    ``characters``; the px it now rises by more."""
    lines = [piece for line in note.text.split("<br>") for piece in _wrap(line, characters)]
    added = round((len(lines) - note.text.count("<br>") - 1) * note.font.size * 1.3)
    note.text = "<br>".join(lines)
    return added


def _wrap_below(fig: go.Figure, note, characters: float, size: float) -> None:
    """Wrap ``note`` (below the plots) into lines of ``characters``, hung from its place, the
    bottom margin and the height grown for the lines added, and sliders below the plots moved
    down as much."""
    lines = [piece for line in note.text.split("<br>") for piece in _wrap(line, characters)]
    added = round((len(lines) - note.text.count("<br>") - 1) * size * 1.3)
    note.update(text="<br>".join(lines), yanchor="top")
    fig.layout.margin.b = (fig.layout.margin.b or 80) + added
    for slider in fig.layout.sliders:  # one below the plots moves down with the lines
        if (slider.y or 0) <= 0:
            slider.pad.t = (slider.pad.t or 0) + added
    if fig.layout.height:
        fig.layout.height += added


def _wrap(line: str, width: float) -> list[str]:
    """``line`` in pieces of at most ``width`` characters, broken at spaces (a longer word on
    a line of its own)."""
    pieces, current = [], ""
    for word in line.split(" "):
        if current and len(current) + 1 + len(word) > width:
            pieces.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    return [*pieces, current]
