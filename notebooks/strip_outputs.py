"""Strip notebook outputs except those of `# NBVAL_CHECK_OUTPUT` cells (nbval compares those).

Usage: python notebooks/strip_outputs.py notebooks/*.ipynb   (also run by `make strip`)
"""

from __future__ import annotations

import sys

import nbformat

CHECK = "# NBVAL_CHECK_OUTPUT"


def strip(path: str) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if CHECK not in cell.source:  # nbval needs a check cell's count: "unrun" cells fail
            cell.outputs = []
            cell.execution_count = None
        cell.metadata = {}
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)


if __name__ == "__main__":
    for notebook in sys.argv[1:]:
        strip(notebook)
