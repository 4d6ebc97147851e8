"""One self-contained HTML page: plotly.js embedded once, every figure inline, no CDN."""

from __future__ import annotations

import html
from pathlib import Path

import plotly.io as pio
from plotly.offline import get_plotlyjs

from .._version import __version__
from ..runs import write_atomically
from .sections import Section

__all__ = ["write_page"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em;
       color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
nav a { margin-right: 1em; } .note { color: #666; } .figure { margin: 1em 0; }
.caution { color: #b2182b; font-weight: 600; }
table { border-collapse: collapse; margin: 0.5em 0; } th, td { padding: 0.25em 0.8em;
  border-bottom: 1px solid #eee; text-align: left; } td { font-variant-numeric: tabular-nums; }
table.scores { display: block; overflow-x: auto; max-width: 100%; }
table.scores th, table.scores td { padding: 0.25em 0.5em; }
caption { caption-side: bottom; text-align: left; color: #666; padding-top: 0.4em;
  max-width: calc(100vw - 5em); position: sticky; left: 0; }
"""


def write_page(sections: list[Section], skipped: dict[str, str], title: str, out: Path) -> Path:
    """Write ``out`` (a folder; the page is ``index.html``) and return the page's path."""
    out.mkdir(parents=True, exist_ok=True)
    anchors = [f"s{i}" for i in range(len(sections))]
    nav = "".join(
        f"<a href='#{a}'>{html.escape(s.title)}</a>" for a, s in zip(anchors, sections, strict=True)
    )
    body = []
    for anchor, section in zip(anchors, sections, strict=True):
        figures = "".join(
            "<div class='figure'>"
            + pio.to_html(fig, full_html=False, include_plotlyjs=False, config={"responsive": True})
            + "</div>"
            for fig in section.figures
        )
        body.append(
            f"<section id='{anchor}'><h2>{html.escape(section.title)}</h2>"
            f"<p>{html.escape(section.text)}</p>{section.html}{figures}</section>"
        )
    if skipped:
        items = "".join(
            f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in skipped.items()
        )
        body.append(f"<section><h2>Not applicable to this model</h2><ul>{items}</ul></section>")
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1><p class='note'>vizkit {__version__}</p>"
        f"<nav>{nav}</nav>{''.join(body)}</body></html>"
    )
    path = out / "index.html"
    write_atomically(path, page)
    return path
