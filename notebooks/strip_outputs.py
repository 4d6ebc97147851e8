"""Strip notebook outputs except those of cells tagged `nbval-check-output` (nbval compares
those); cell metadata other than the nbval tags is dropped.

Usage: python notebooks/strip_outputs.py notebooks/*.ipynb   (also run by `make strip`)
"""

from __future__ import annotations

import sys

import nbformat

CHECK = "nbval-check-output"  # nbval's cell tags: nbval-check-output, nbval-ignore-output, ...


def strip(path: str) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tags = [t for t in cell.metadata.get("tags", []) if t.startswith("nbval-")]
        if CHECK not in tags:  # nbval needs a check cell's count: "unrun" cells fail
            cell.outputs = []
            cell.execution_count = None
        cell.metadata = {"tags": tags} if tags else {}
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)


if __name__ == "__main__":
    for notebook in sys.argv[1:]:
        strip(notebook)
