"""Benchmark tables recorded with --record carry their stamp, and the manual's benchmarks page is
generated from them; the tutorials are the notebooks without nbval's tags."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(path: Path, name: str):
    sys.path.insert(0, str(path.parent))  # the benchmarks import their sibling `timing`
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


def test_a_recorded_table_is_stamped_and_rendered(tmp_path, monkeypatch, capsys):
    timing = load(ROOT / "benchmarks" / "timing.py", "timing")
    generate = load(ROOT / "docs" / "generate.py", "generate")
    monkeypatch.setattr(timing, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "gradcam.py"), "--record"])
    assert timing.stamp(argparse.Namespace(device="cpu", dtype="float32"))["command"] == (
        "python benchmarks/gradcam.py --record"
    )
    args = argparse.Namespace(device="cpu", dtype="float32", repeats=3, record=True)
    times = {"plain": [0.10, 0.12, 0.11], "vizkit": [0.13, 0.12, 0.14]}
    faults = {"plain": [5, 7, 6], "vizkit": [9, 9, 9]}
    title = "deit_small, batch 16; median of 3 rounds"
    timing.print_table(times, faults, "plain", args, title)
    (file,) = tmp_path.glob("*.json")
    run = json.loads(file.read_text())
    assert run["stamp"]["threads"] >= 1 and run["stamp"]["torch"] and run["stamp"]["date"]
    assert run["columns"][2] == "ratio to plain"
    assert run["rows"][1] == ["vizkit", "130.0", "1.18x", "120.0..140.0", "9"]
    timing.print_table(times, faults, "plain", args, title)  # the same configuration again
    assert len(list(tmp_path.glob("*.json"))) == 1  # replaced, not added
    page = generate.benchmark_results_page(tmp_path)
    assert "| vizkit | 130.0 | 1.18x | 120.0..140.0 | 9 |" in page
    assert generate._table_row(["mean |change|", "0.1"]) == "| mean \\|change\\| | 0.1 |"
    assert f"{run['stamp']['threads']} threads" in page and "deit_small, batch 16" in page
    assert "No recorded runs yet" in generate.benchmark_results_page(tmp_path / "none")
    assert "recorded in" in capsys.readouterr().out


def test_tutorials_drop_the_nbval_tags_and_keep_the_cells():
    generate = load(ROOT / "docs" / "generate.py", "generate")
    source = (ROOT / "notebooks" / "01_cait.ipynb").read_text()
    original, page = json.loads(source), json.loads(generate.tutorial(source))
    assert any("tags" in c["metadata"] for c in original["cells"])
    assert not any("tags" in c["metadata"] for c in page["cells"])
    assert [c["source"] for c in page["cells"]] == [c["source"] for c in original["cells"]]
