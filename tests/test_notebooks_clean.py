"""Notebooks are committed stripped (outputs only in check cells), thin (no long functions), and
mark nbval's behaviour with cell tags, not comments in the code readers copy."""

import ast
import json
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
CHECK = "nbval-check-output"


def _tags(cell) -> list[str]:
    return cell.metadata.get("tags", [])


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_only_in_check_cells(path):
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    leftovers = [i for i, c in enumerate(cells) if c.outputs and CHECK not in _tags(c)]
    assert not leftovers, (
        f"strip outputs of code cells {leftovers}: python notebooks/strip_outputs.py"
    )
    unrecorded = [i for i, c in enumerate(cells) if CHECK in _tags(c) and not c.outputs]
    assert not unrecorded, f"check cells {unrecorded} have no reference output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_long_definitions(path):
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 5, f"{node.name} is {length} lines: move it into the package"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_markers_are_tags(path):
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    commented = [i for i, c in enumerate(cells) if "NBVAL_" in c.source]
    assert not commented, f"code cells {commented} carry # NBVAL_ comments: use cell tags"
    assert any(CHECK in _tags(c) for c in cells), "no check cell: nbval would test nothing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_an_id(path):
    """nbformat 4.5 cells carry ids; a cell pasted in without one makes nbval warn (and a future
    nbformat fail)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    missing = [i for i, cell in enumerate(raw["cells"]) if "id" not in cell]
    assert not missing, f"cells {missing} have no id: nbformat.validator.normalize adds them"
