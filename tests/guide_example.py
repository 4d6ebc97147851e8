"""Run a guide's first Python example as a reader would: the code block of
docs/guide/<page>, executed in the current folder; what it printed, and the comment after each
``print(`` line (what the guide says it prints)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

GUIDE = Path(__file__).parents[1] / "docs" / "guide"


def run_first_example(page: str) -> tuple[list[str], list[str]]:
    """(the lines the first ``python`` block of ``page`` printed, the comment of each of its
    ``print(`` lines)."""
    block = (GUIDE / page).read_text().split("```python\n", 1)[1].split("```", 1)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, page, "exec"), {"__name__": "guide"})
    said = [line.split("# ", 1)[1] for line in block.splitlines() if line.startswith("print(")]
    return out.getvalue().splitlines(), said
