"""The durable-run layer (`vizkit.runs`, issue 69): a file is replaced whole or not at all, at
every step a kill can hit; the folder is synced; nothing else in vizkit renames a file; one
model fingerprint."""

from __future__ import annotations

import ast
import copy
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import vizkit
from vizkit.runs import (
    model_fingerprint,
    replaced_whole,
    tensor_fingerprint,
    write_atomically,
    write_json,
)

PACKAGE = Path(vizkit.__file__).parent

# a child that replaces FILE's old content by new content and is SIGKILLed at one step
KILLED_WRITE = """
import os, signal, sys
import vizkit.runs.files as files
step, file = sys.argv[1], sys.argv[2]
fsyncs = []
real_fsync, real_replace = os.fsync, os.replace
def fsync(fd):
    fsyncs.append(fd)
    if step == ("file synced", "folder synced")[min(len(fsyncs), 2) - 1]:
        os.kill(os.getpid(), signal.SIGKILL)
    real_fsync(fd)
def replace(a, b):
    if step == "renaming":
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(a, b)
    if step == "renamed":
        os.kill(os.getpid(), signal.SIGKILL)
files.os.fsync, files.os.replace = fsync, replace
files.write_atomically(file, b"new " * 50_000)
"""


@pytest.mark.parametrize("step", ["file synced", "renaming", "renamed", "folder synced"])
def test_a_kill_at_any_step_leaves_the_old_file_or_the_new_whole(tmp_path, step):
    file = tmp_path / "store.json"
    file.write_bytes(b"old " * 1000)
    child = subprocess.run([sys.executable, "-c", KILLED_WRITE, step, str(file)], timeout=120)
    assert child.returncode == -signal.SIGKILL
    assert file.read_bytes() in (b"old " * 1000, b"new " * 50_000)
    if step in ("renamed", "folder synced"):
        assert file.read_bytes() == b"new " * 50_000
    else:
        assert file.read_bytes() == b"old " * 1000
    leftovers = [p.name for p in tmp_path.iterdir() if p != file]
    assert all(name.endswith(".partial") for name in leftovers)  # a kill cannot clean up


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    file = tmp_path / "checkpoint.pt"
    file.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        with replaced_whole(file) as partial:
            partial.write_bytes(b"half")
            raise RuntimeError("disk full")
    assert file.read_bytes() == b"old" and sorted(tmp_path.iterdir()) == [file]


def test_the_file_and_its_folder_are_synced(tmp_path, monkeypatch):
    import vizkit.runs.files as files

    synced = []
    real = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: synced.append(os.readlink(
        f"/proc/self/fd/{fd}")) or real(fd))  # fmt: skip
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("reads the synced paths from /proc")
    write_json(tmp_path / "a.json", {"x": 1})
    assert synced[-1] == str(tmp_path)  # the folder, after the rename
    assert synced[0].endswith(".partial")  # the data, before it
    assert (tmp_path / "a.json").read_text() == '{\n "x": 1\n}\n'
    assert write_atomically(tmp_path / "b.txt", "é").read_bytes() == "é".encode()


def _renames(tree: ast.AST) -> list[int]:
    """Lines of calls that rename a file: ``os.replace``/``os.rename``/``shutil.move``, and a
    one-argument ``.replace(target)`` or ``.rename(target)`` (pathlib; ``str.replace`` takes two
    and ``dataclasses.replace`` keywords)."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        name = node.func.attr
        module_call = (owner, name) in {("os", "replace"), ("os", "rename"), ("shutil", "move")}
        path_call = name in ("replace", "rename") and len(node.args) == 1 and not node.keywords
        if module_call or (path_call and owner not in ("dataclasses",)):
            lines.append(node.lineno)
    return lines


def test_no_module_outside_the_run_layer_renames_a_file():
    found = {}
    for file in PACKAGE.rglob("*.py"):
        if file.parent.name == "runs":
            continue
        lines = _renames(ast.parse(file.read_text()))
        if lines:
            found[str(file.relative_to(PACKAGE))] = lines
    assert found == {}, "write through vizkit.runs (write_atomically, replaced_whole)"
    planted = ast.parse(
        textwrap.dedent("""
        part.replace(file)
        os.replace(a, b)
        title.replace("a", "b")
        dataclasses.replace(site, path=p)
    """)
    )
    assert _renames(planted) == [2, 3]  # the check sees a rename, not a string edit


def test_one_fingerprint_of_a_model():
    import importlib

    evaluate = importlib.import_module("vizkit.metrics.evaluate")  # the function shadows it
    manifest = importlib.import_module("vizkit.store.manifest")

    model = torch.nn.Linear(3, 2)
    twin = copy.deepcopy(model)
    assert model_fingerprint(model) == model_fingerprint(twin)
    with torch.no_grad():
        twin.bias[0] = torch.nextafter(twin.bias[0], torch.tensor(1.0))  # one bit
    assert model_fingerprint(model) != model_fingerprint(twin)
    assert evaluate.model_fingerprint is manifest.model_fingerprint is model_fingerprint
    assert tensor_fingerprint(torch.zeros(2)) != tensor_fingerprint(torch.zeros(2, 1))
    assert tensor_fingerprint(torch.zeros(2)) != tensor_fingerprint(torch.zeros(2).half())


def test_the_fingerprint_is_the_one_stores_recorded():
    """Hashing in place and side by side keeps the digest that stores and evaluation runs
    written before recorded: SHA-1 of each tensor's shape, dtype and bytes, in state order."""
    import hashlib

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).to(torch.bfloat16)
    digest = hashlib.sha1(b"Sequential")
    for name, tensor in model.state_dict().items():
        part = hashlib.sha1(f"{tuple(tensor.shape)} {tensor.dtype}".encode())
        part.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        digest.update(name.encode() + part.hexdigest().encode())
    assert model_fingerprint(model) == digest.hexdigest()
