"""Notebooks are committed stripped (outputs only in check cells) and thin (no long functions)."""

import ast
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
CHECK = "# NBVAL_CHECK_OUTPUT"


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_only_in_check_cells(path):
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    leftovers = [i for i, c in enumerate(cells) if c.outputs and CHECK not in c.source]
    assert not leftovers, (
        f"strip outputs of code cells {leftovers}: python notebooks/strip_outputs.py"
    )
    unrecorded = [i for i, c in enumerate(cells) if CHECK in c.source and not c.outputs]
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
