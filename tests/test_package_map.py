"""docs/concepts/package-map.md is true: every module's imports (read statically) go to rooms
on lower floors of its table, every room is in the table, and every module loaded by a name in
a string is one its plug-ins table lists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vizkit"
MAP = ROOT / "docs" / "concepts" / "package-map.md"


def _rows(table_head: str) -> list[list[str]]:
    """The cells of each row of the map's table whose head row starts with ``table_head``."""
    lines = MAP.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(table_head))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def _floors() -> dict[str, int]:
    return {room: int(floor) for floor, room, _ in _rows("| floor | room |")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    """The room of ``vizkit.x.y``: ``x``; the package root's is ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every vizkit module ``path`` imports, relative imports resolved (``from
    .. import zoo`` imports ``vizkit.zoo``)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None:  # from .. import zoo, runs
                found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, name) for line, name in found if name.split(".")[0] == "vizkit"]


def test_every_import_goes_to_a_lower_floor():
    floors = _floors()
    rooms = {_room(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert rooms - set(floors) == set(), "rooms missing from docs/concepts/package-map.md"
    assert set(floors) - rooms == set(), "rooms in the map that the package does not have"
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        room = _room(_module_name(path))
        for line, target in _imports(path):
            other = _room(target)
            if other != room and floors[other] >= floors[room]:
                broken.append(
                    f"{path.relative_to(ROOT)}:{line} ({room}, floor {floors[room]}) imports "
                    f"{target} ({other}, floor {floors[other]})"
                )
    assert broken == [], "\n".join(broken)


def test_only_the_listed_plug_ins_are_loaded_by_name():
    listed = {(loader, loaded) for loader, loaded, _ in _rows("| loader | loads |")}
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        module = _module_name(path)
        names = {  # module-level string constants, e.g. _BUILTINS = "vizkit.families"
            target.id: node.value.value
            for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)
        }  # fmt: skip
        for node in ast.walk(tree):
            called = isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "importlib.import_module", "__import__")  # fmt: skip
            if not called:
                continue
            argument = node.args[0]
            if isinstance(argument, ast.Name):
                loaded = names[argument.id]
            elif isinstance(argument, ast.Constant):
                loaded = argument.value
            else:  # a name built at run time: f"{__package__}.{_name}"
                loaded = re.sub(r"\{__package__\}", module.rsplit(".", 1)[0], ast.unparse(argument))
                loaded = re.sub(r"^f?['\"]|['\"]$", "", loaded)
                loaded = re.sub(r"\.\{\w+\}$", ".<module>", loaded)
            found.add((module, loaded))
    assert found == listed
