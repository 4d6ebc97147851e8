"""The persistence discipline of `vizkit.journal` and the evaluation log on it: a file vizkit did
not write is never written; a process killed (SIGKILL) at every step of a rewrite or an append
loses nothing computed and counts nothing twice; one writer at a time; a resume on other data,
another order or a shuffling loader is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import pytest
import timm
import torch
from torch.utils.data import DataLoader, TensorDataset

import vizkit as vk
from vizkit import journal as journal_module
from vizkit.journal import Journal

CONFIG = {"model": "abc", "methods": ["random"]}
JOURNAL = journal_module.__file__

# in a child: `vizkit.journal` (its file is sys.argv[-1]) with the package's __init__ left out,
# so that no torch is imported (the journal and `vizkit.runs.files` use the standard library)
LOAD_JOURNAL = """
import os, sys, types
root = os.path.dirname(sys.argv[-1])
for name, folder in (("vizkit", root), ("vizkit.runs", os.path.join(root, "runs"))):
    sys.modules[name] = types.ModuleType(name)
    sys.modules[name].__path__ = [folder]
import vizkit.journal as journal_module
"""

# a child that appends entries 0..n-1, leaves a cut line, then reopens the journal (which
# rewrites it) or appends entry n, and SIGKILLs itself around the k-th fsync / rename
CHILD = LOAD_JOURNAL + textwrap.dedent("""
    import signal
    Journal = journal_module.Journal
    path, n, action, when = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    step = int(sys.argv[5])
    config = {"model": "abc", "methods": ["random"]}
    with Journal(path, "evaluation", config) as journal:
        for i in range(n):
            journal.append({"step": i})
    with open(path, "a") as file:
        file.write('{"step": ')  # cut short
    calls = []
    def dying(original):
        def call(*args):
            calls.append(1)
            if len(calls) == step and when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            result = original(*args)
            if len(calls) == step and when == "after":
                os.kill(os.getpid(), signal.SIGKILL)
            return result
        return call
    os.fsync, os.replace = dying(os.fsync), dying(os.replace)
    with Journal(path, "evaluation", config) as journal:
        if action == "append":
            journal.append({"step": n})
    print("survived")
""")


def _run_child(path, n, action, when, step):
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(n), action, when, str(step), JOURNAL],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


# the rewrite's calls: fsync(temporary), replace(temporary, file), fsync(folder); an
# append's: fsync(file)
@pytest.mark.parametrize(("when", "step"), [(w, s) for s in (1, 2, 3) for w in ("before", "after")])
def test_a_kill_at_every_step_of_a_rewrite_loses_nothing(tmp_path, when, step):
    path = tmp_path / "log.jsonl"
    child = _run_child(path, 5, "reopen", when, step)
    assert child.returncode == -signal.SIGKILL, child.stderr
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Journal(path, "evaluation", CONFIG) as journal:
            assert journal.entries == [{"step": i} for i in range(5)]
    renamed = step > 2 or (step == 2 and when == "after")  # else the cut line is still there
    assert any("dropped" in str(w.message) for w in caught) == (not renamed)
    assert not list(tmp_path.glob(".log.jsonl.*.tmp"))  # the killed rewrite's leftover removed
    lines = path.read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["vizkit"] == "evaluation"


@pytest.mark.parametrize(("action", "when", "step"), [
    ("append", "before", 4), ("append", "after", 4),
])  # fmt: skip
def test_a_kill_around_an_appends_fsync_keeps_the_entry_whole_or_out(tmp_path, action, when, step):
    path = tmp_path / "log.jsonl"
    child = _run_child(path, 3, action, when, step)
    assert child.returncode == -signal.SIGKILL, child.stderr
    with Journal(path, "evaluation", CONFIG) as journal:
        assert journal.entries in ([{"step": i} for i in range(3)],
                                   [{"step": i} for i in range(4)])  # fmt: skip


def test_a_file_vizkit_did_not_write_is_never_written(tmp_path):
    model, data = _model_and_data()
    table = vk.evaluate(model, data, methods=["random"], metrics=["sparseness"], progress=False)
    files = {
        "notes.txt": b"my own notes\nline two\n",
        "results.json": json.dumps(
            {"methods": table.methods, "mean": table.mean.tolist()}
        ).encode(),
        "image.bin": bytes(range(256)) * 4,
        "old.jsonl": b'{"format": "vizkit evaluation 1", "config": {}}\n',
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match="is not a vizkit evaluation file"):
            vk.evaluate(model, data, methods=["random"], metrics=["sparseness"],
                        out=tmp_path / name, progress=False)  # fmt: skip
        assert (tmp_path / name).read_bytes() == content, name


def test_one_writer_at_a_time(tmp_path):
    path = tmp_path / "log.jsonl"
    with Journal(path, "evaluation", CONFIG):
        with pytest.raises(RuntimeError, match=f"being written by process {os.getpid()}"):
            Journal(path, "evaluation", CONFIG)
        load = LOAD_JOURNAL + f"journal_module.Journal(sys.argv[1], 'evaluation', {CONFIG!r})"
        other = subprocess.run([sys.executable, "-c", load, str(path), JOURNAL],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert other.returncode != 0 and f"process {os.getpid()}" in other.stderr
    with Journal(path, "evaluation", CONFIG) as journal:  # released on close
        assert journal.entries == []


def _model_and_data(count: int = 12):
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=4, img_size=32,
                              patch_size=8, depth=1).eval()  # fmt: skip
    x = torch.randn(count, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return model, TensorDataset(x, torch.arange(count) % 4)


def test_a_resume_on_other_data_another_order_or_a_shuffled_loader_is_refused(tmp_path):
    model, data = _model_and_data(24)
    run = {"methods": ["random"], "metrics": ["sparseness"], "batch_size": 4, "progress": False}
    x, labels = data.tensors
    out = tmp_path / "log.jsonl"
    vk.evaluate(model, (x[:12], labels[:12]), out=out, **run)
    with pytest.raises(ValueError, match="Batch 0 of the data is not the batch"):
        vk.evaluate(model, (x[12:], labels[12:]), out=out, **run)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="another order"):
        vk.evaluate(model, (x[:12][order], labels[:12][order]), out=out, **run)
    shuffled = DataLoader(TensorDataset(x[:12], labels[:12]), batch_size=4, shuffle=True)
    with pytest.raises(ValueError, match="shuffle=False"):
        vk.evaluate(model, shuffled, out=tmp_path / "other.jsonl", **run)
    again = vk.evaluate(model, (x[:12], labels[:12]), out=out, **run)  # the same data resumes
    assert again.per_image.shape[-1] == 12


def test_a_damaged_entry_is_dropped_with_what_follows_and_redone(tmp_path):
    model, data = _model_and_data()
    run = {"methods": ["random"], "metrics": ["sparseness"], "batch_size": 4, "progress": False}
    whole = vk.evaluate(model, data, **run)
    out = tmp_path / "log.jsonl"
    vk.evaluate(model, data, out=out, **run)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text(lines[0] + lines[1] + '{"batch": 1}\n' + lines[3])  # hand-edited, no method
    with pytest.warns(UserWarning, match="2 damaged or cut line"):
        resumed = vk.evaluate(model, data, out=out, **run)
    torch.testing.assert_close(resumed.per_image, whole.per_image, equal_nan=True)
    assert len(out.read_text().splitlines()) == 4
