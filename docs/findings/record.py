"""Measure the findings the paper pages state in words, from the shipped zoo models, and record
them in docs/findings/<paper>.json, which the pages read (mkdocs-macros: ``{{ refiner.f_out.ViT
}}``), so no measured number on a paper page is typed.

Each ``docs/findings/<paper>.py`` has ``measure() -> dict``: nested dicts of display strings.
It raises ``statements.FindingChanged`` when a relation the page states in words (e.g. "the
ResNet evolves more than the ViT") no longer holds, so the page cannot silently contradict its
numbers. Each record is stamped with the date, versions and command, and the sha256 of every
zoo model it read; ``tests/test_docs_findings.py`` checks that the stamps match the shipped
models and recomputes the values. A module's ``SHARES`` names the findings that are shares of
a set of images (dotted path -> the path of the record's count of those images): measured on
another CPU, such a share may differ by one image, whose prediction or peak is a near tie that
rounding decides, and the test allows that.

    python docs/findings/record.py                 # every paper
    python docs/findings/record.py refiner sot     # some
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

import timm
import torch

import vizkit as vk

FINDINGS = Path(__file__).resolve().parent
PAPERS = ("cait", "refiner", "masks", "sot")
if str(FINDINGS) not in sys.path:
    sys.path.insert(0, str(FINDINGS))  # the paper modules import `statements` beside them


def paper_module(paper: str):
    """docs/findings/<paper>.py, loaded from its path (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"findings_{paper}", FINDINGS / f"{paper}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def zoo_reads() -> Iterator[set[str]]:
    """The names of the zoo models and cards read inside the context."""
    names, load, card = set(), vk.zoo.load, vk.zoo.card

    def tracked(function):
        def read(name, *args, **kwargs):
            names.add(name)
            return function(name, *args, **kwargs)

        return read

    vk.zoo.load, vk.zoo.card = tracked(load), tracked(card)
    try:
        yield names
    finally:
        vk.zoo.load, vk.zoo.card = load, card


def measure(paper: str) -> tuple[dict, dict[str, str]]:
    """The paper's findings and the sha256 of each zoo model they read."""
    torch.manual_seed(0)
    with zoo_reads() as names:
        values = paper_module(paper).measure()
    return values, {name: vk.zoo.card(name)["sha256"] for name in sorted(names)}


def stamp(command: str) -> dict:
    """When, where and by which command a record was measured."""
    return {
        "date": datetime.date.today().isoformat(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "vizkit": vk.__version__,
        "command": command,
    }


def record(paper: str) -> Path:
    values, models = measure(paper)
    file = FINDINGS / f"{paper}.json"
    content = {**values, "stamp": stamp(f"python docs/findings/record.py {paper}"),
               "models": models}  # fmt: skip
    file.write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n")
    return file


def main(papers: list[str]) -> None:
    unknown = sorted(set(papers) - set(PAPERS))
    if unknown:
        raise SystemExit(f"No findings for {unknown}; papers: {', '.join(PAPERS)}.")
    for paper in papers or PAPERS:
        print(f"recorded {record(paper).relative_to(FINDINGS.parents[1])}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
