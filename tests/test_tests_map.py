"""docs/concepts/tests.md is true: every module of vizkit has a test file found by its name or
a row of the map naming the test files that check it (or is listed as untested); a row names
modules and test files that exist, only modules without a test file of their name, and test
files that mention a name of the module, or of a module they reach it through. Read statically:
the modules' names with `ast`, the tests' text with regular expressions."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from test_package_map import _imports, _module_name

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vizkit"
TESTS = ROOT / "tests"
MAP = ROOT / "docs" / "concepts" / "tests.md"
# calls that register a name other code looks up by string: a saliency method, a metric, a
# model family (and the model classes it claims), a report section
REGISTRARS = ("saliency_method", "metric", "Family", "add_section")


def _paths() -> dict[str, Path]:
    """Every module of the package by dotted name, packages (``__init__.py``) included."""
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _has_code(path: Path) -> bool:
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        for node in ast.parse(path.read_text()).body
    )


def _modules() -> dict[str, Path]:
    """The modules the map covers: every module but the ``__init__.py`` files that only import
    and list their exports (one that defines a function or class is a module of its package's
    name, ``vizkit.report``)."""
    return {
        name: path
        for name, path in _paths().items()
        if path.name != "__init__.py" or _has_code(path)
    }


@cache
def _names(path: Path) -> frozenset[str]:
    """A module's names: its ``__all__`` (else its top-level functions and classes without a
    leading underscore), and the names it registers under: a method, metric, family or report
    section name, the module classes a family claims and the timm modules it reads them from."""
    tree = ast.parse(path.read_text())
    names = None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
            names = set(ast.literal_eval(node.value))
    if names is None:
        names = {
            node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not node.name.startswith("_")
        }  # fmt: skip
    family = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = ast.unparse(node.func).split(".")[-1]
        if called not in REGISTRARS:
            continue
        family |= called == "Family"
        first = node.args[0] if node.args else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            names.add(first.value)
        for keyword in node.keywords:
            if keyword.arg in ("models", "attention", "unplaced") and isinstance(
                keyword.value, ast.Dict
            ):
                # beit.Beit, f"{_VIT}:ViTModel": the class name
                names |= {re.split(r"[.:]", ast.unparse(key).strip("f'\""))[-1]
                          for key in keyword.value.keys if key is not None}  # fmt: skip
    if family:
        names |= {
            alias.name for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module == "timm.models"
            for alias in node.names
        }  # fmt: skip
    return frozenset(names)


def _mentions(text: str, names: frozenset[str], module: str) -> bool:
    """Whether ``text`` holds one of ``names`` as a word, or the module's dotted name (a test
    that runs ``python -m vizkit.cli``, a registry that imports a module by its name)."""
    words = [re.escape(name) for name in names] + [re.escape(module) + r"(?!\.\w)"]
    return re.search(rf"\b({'|'.join(words)})\b", text) is not None


def _by_name(module: str, path: Path) -> list[Path]:
    """The test files named after ``module``: ``tests/test_<name>.py`` and
    ``tests/<its folder under vizkit>/test_<name>.py``."""
    parts = module.split(".")
    folder, stem = parts[1:-1], parts[-1]
    candidates = [TESTS / f"test_{stem}.py", TESTS.joinpath(*folder, f"test_{stem}.py")]
    return [test for test in dict.fromkeys(candidates) if test.exists()]


def _found_by_name(module: str, path: Path) -> bool:
    """A test file of the module's name exists and mentions one of its names (tests/test_names.py
    is vizkit.hooks.names', not vizkit.models.names')."""
    return any(_mentions(test.read_text(), _names(path), module) for test in _by_name(module, path))


def _table_rows(head: str) -> list[list[str]]:
    """The cells of every row of every table of the map whose head row is ``head``."""
    lines = MAP.read_text().splitlines()
    rows = []
    for start in [i for i, line in enumerate(lines) if line.startswith(head)]:
        for line in lines[start + 2 :]:
            if not line.startswith("|"):
                break
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _map() -> dict[str, tuple[list[str], list[str]]]:
    """module -> (test files, modules the tests reach it through) of the map's rows: a tests
    cell lists `tests/...` files, then optionally "through `vizkit.x`, `vizkit.y`"."""
    rows = {}
    for module, cell in _table_rows("| module | tests |"):
        module = module.strip("`")
        assert module not in rows, f"{module} has two rows"
        quoted = re.findall(r"`([^`]+)`", cell)
        rows[module] = (
            [q for q in quoted if q.startswith("tests/")],
            [q for q in quoted if q.startswith("vizkit")],
        )
    return rows


def _untested() -> list[str]:
    return [cells[0].strip("`") for cells in _table_rows("| module | what it is |")]


def _reached(paths: dict[str, Path]) -> dict[str, set[str]]:
    """module -> every vizkit module it imports, directly or through others."""
    direct = {name: {target for _, target in _imports(path)} for name, path in paths.items()}
    closure = {}
    for name in direct:
        seen, todo = set(), [name]
        while todo:
            for target in direct.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        closure[name] = seen
    return closure


def test_every_module_is_found_by_name_or_in_the_map():
    modules, rows, untested = _modules(), _map(), _untested()
    by_name = {name for name, path in modules.items() if _found_by_name(name, path)}
    problems = [f"{m}: no test file of its name, no row and not listed untested"
                for m in sorted(set(modules) - by_name - set(rows) - set(untested))]  # fmt: skip
    problems += [f"{m}: in the map, but no such module" for m in sorted(set(rows) - set(modules))]
    problems += [f"{m}: listed untested, but no such module"
                 for m in sorted(set(untested) - set(modules))]  # fmt: skip
    problems += [f"{m}: has a test file of its name ({_by_name(m, modules[m])[0].name}), so no "
                 "row" for m in sorted(by_name & (set(rows) | set(untested)))]  # fmt: skip
    problems += [f"{m}: in the map and listed untested" for m in sorted(set(rows) & set(untested))]
    assert problems == [], "\n".join(problems)


def test_every_row_names_tests_that_reach_its_module():
    paths, modules = _paths(), _modules()
    reached = _reached(paths)
    problems = []
    for module, (tests, through) in sorted(_map().items()):
        if module not in modules:
            continue  # the test above names it
        if not tests:
            problems.append(f"{module}: its row names no test file")
        for other in through:
            if other not in paths:
                problems.append(f"{module}: through {other}, no such module")
            elif module not in reached[other] and not _mentions(
                paths[other].read_text(), _names(modules[module]), module
            ):
                problems.append(f"{module}: {other} neither imports nor names it")
        reaching = [module, *(o for o in through if o in paths)]
        for test in tests:
            if not (ROOT / test).is_file():
                problems.append(f"{module}: {test} does not exist")
                continue
            text = (ROOT / test).read_text()
            if not any(_mentions(text, _names(paths[m]), m) for m in reaching):
                names = sorted(set().union(*(_names(paths[m]) for m in reaching)))
                problems.append(f"{module}: {test} names none of {', '.join(reaching)}: {names}")
    assert problems == [], "\n".join(problems)
