"""Write the manual's generated pages into docs/generated/ (run by `make docs`; never edited):

- hook_names.md: every adapted timm family's hook names and shapes, from the adapters;
- ledger_<paper>.md: the papers' claims ledgers, from the zoo cards (docs/ledger.py);
- tutorials/: the notebooks, executed by mkdocs-jupyter at build time;
- benchmark_results.md: the tables `make bench` recorded (benchmarks/ with --record) in
  docs/benchmark_results/, each with its stamp (device, threads, versions, command);
- changelog.md: the repository's CHANGELOG.md.

    python docs/generate.py
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import timm
import torch

from vizkit.hooks import HookedModel
from vizkit.hooks.family import family_layout
from vizkit.hooks.names import collapsed_names
from vizkit.hooks.taps import PATTERN_KINDS
from vizkit.models.representatives import FAMILIES

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
OUT = DOCS / "generated"


def hook_names_page() -> str:
    """One table per adapted family: canonical names (index ranges collapsed) and shapes."""
    lines = [
        "| kind | what the map's rows and columns are |",
        "|---|---|",
        *(f"| `{kind}` | {meaning} |" for kind, meaning in PATTERN_KINDS.items()),
        "",
    ]
    for family, rep in FAMILIES.items():
        torch.manual_seed(0)
        model = timm.create_model(rep.model, pretrained=False, **rep.kwargs)
        if family_layout(model) is None:
            continue
        hm = HookedModel(model)
        names = [n for n in hm.hook_names() if not n.endswith(".hook_out")]
        lines += [
            f"### {family}",
            "",
            f"`{rep.model}` ({type(model).__name__}), "
            f"{len(hm.hook_names()) - len(names)} generic `<module>.hook_out` names not listed.",
            "",
            "| hook name | shape | map kind |",
            "|---|---|---|",
        ]
        for group, first in collapsed_names(names):
            tap = hm.tap(first)
            lines.append(f"| `{group}` | {tap.shape or ''} | {tap.kind or ''} |")
        lines.append("")
    return "\n".join(lines)


def tutorial(notebook: str) -> str:
    """The notebook (JSON text) without its cells' tags: they tell nbval which outputs to compare
    and would show as labels on the page."""
    content = json.loads(notebook)
    for cell in content["cells"]:
        cell["metadata"].pop("tags", None)
    return json.dumps(content, indent=1, ensure_ascii=False) + "\n"


def benchmark_results_page(folder: Path = DOCS / "benchmark_results") -> str:
    """Every recorded benchmark table, by benchmark, then by configuration (numbers by value)."""
    runs = [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]
    if not runs:
        return "No recorded runs yet: `make bench` records them.\n"
    lines = []
    for run in sorted(runs, key=lambda r: (r["benchmark"], _natural(r["title"]))):
        st = run["stamp"]
        what, *notes = (part.strip() for part in run["title"].split(";"))
        for stamped in (f", torch {st['torch']}", f", {st['device']}", f", {st['dtype']}"):
            what = what.replace(stamped, "")  # the stamp line says these
        lines += [
            f"### {run['benchmark']}: {what}",
            "",
            f"{st['date']}, {_with_threads(st)}, {st['dtype']}"
            + "".join(f"; {note}" for note in notes)
            + f"; python {st['python']}, torch {st['torch']}, timm {st['timm']}, vizkit "
            f"{st['vizkit']}. `{st['command']}`",
            "",
            _table_row(run["columns"]),
            "|" + "---|" * len(run["columns"]),
            *(_table_row(row) for row in run["rows"]),
            "",
        ]
    return "\n".join(lines)


def _table_row(cells: list[str]) -> str:
    """One markdown table row; a "|" in a cell is escaped, not read as a column break."""
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _natural(text: str) -> list:
    """A sort key that orders the numbers in ``text`` by value ("6 x 6" before "14 x 14")."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", text)]  # fmt: skip


def _with_threads(stamp: dict) -> str:
    """The device, with the thread count unless its name says it (a CPU's does)."""
    threads = f", {stamp['threads']} threads" if "thread" not in stamp["device"] else ""
    return stamp["device"] + threads


def saliency_methods_page() -> str:
    """The registered saliency methods (`vizkit.methods`): name, what each needs, what it is."""
    from vizkit.methods import METHODS, NEEDS

    lines = ["| method | needs | what the map is |", "|---|---|---|"]
    for name, method in METHODS.items():
        call = f"`vk.{method.fn.__name__}`"
        needs = ", ".join(method.needs) or "nothing"
        summary = method.summary.replace("|", "\\|")
        lines.append(f"| {call} (`{name}`) | {needs} | {summary} |")
    legend = "; ".join(f"*{k}*: {v}" for k, v in NEEDS.items())
    return "\n".join([*lines, "", f"Needs: {legend}.", ""])


README_METHODS = re.compile(
    r"(<!-- saliency methods: docs/generate.py -->\n)(?:.*?\n)?(<!-- /saliency methods -->)", re.S
)


def methods_reference_page() -> str:
    """The API reference of every built-in saliency method, from the registry (each method's
    module in `vizkit.methods`, where mkdocstrings reads its function)."""
    from vizkit.methods import METHODS

    ours = [m for m in METHODS.values() if m.fn.__module__.startswith("vizkit.methods.")]
    return "\n".join(f"::: {m.fn.__module__}.{m.fn.__name__}\n" for m in ours)


def readme_methods() -> str:
    """The README's paragraph on the registered saliency methods (between its markers)."""
    from vizkit.methods import METHODS

    names = [
        f"`{name}`"
        for name, method in METHODS.items()
        if name != "random" and method.fn.__module__.startswith("vizkit.")  # vizkit's own
    ]
    return (
        f"Saliency methods ({len(names)}, from the registry `vizkit.methods`): each is "
        "`vk.<name>(model, x, ...)` returning a `SaliencyResult`, and each name is "
        f"taken by `compare_saliency(methods=[...])`: {', '.join(names)}; the manual's "
        "[analyses page](docs/concepts/analyses.md) says what each needs and is."
    )


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if not README_METHODS.search(text):
        raise SystemExit("README.md lacks the saliency-methods markers")
    readme.write_text(
        README_METHODS.sub(lambda m: m.group(1) + readme_methods() + "\n" + m.group(2), text)
    )
    OUT.mkdir(exist_ok=True)
    (OUT / "hook_names.md").write_text(hook_names_page())
    (OUT / "benchmark_results.md").write_text(benchmark_results_page())
    (OUT / "saliency_methods.md").write_text(saliency_methods_page())
    (OUT / "methods_reference.md").write_text(methods_reference_page())
    spec = importlib.util.spec_from_file_location("ledger", DOCS / "ledger.py")
    ledger = sys.modules["ledger"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ledger)
    ledger.write(OUT)
    tutorials = OUT / "tutorials"
    shutil.rmtree(tutorials, ignore_errors=True)
    tutorials.mkdir()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        (tutorials / notebook.name).write_text(tutorial(notebook.read_text()))
    shutil.copy(ROOT / "CHANGELOG.md", OUT / "changelog.md")
    print(f"wrote {OUT.relative_to(ROOT)}/", file=sys.stderr)


if __name__ == "__main__":
    main()
