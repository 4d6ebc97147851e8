"""Files that a long run writes as it goes and resumes from: a journal is a header line naming
what wrote it and with which settings, then one JSON line per piece of work done. The
discipline (the evaluation log uses it):

- a file vizkit did not write is never opened for writing: the first bytes must be a
  journal header of the same kind (``{"vizkit": kind, ...}``), else the file is refused;
- a journal is held by one writer at a time: an exclusive lock on ``<file>.lock`` (a sidecar
  that stays, holding the pid of the last writer), refused naming the other process;
- an entry is appended, flushed and fsynced before the work counts as done; a line cut short
  by a kill (or one that is not a complete entry) is dropped with everything after it;
- a rewrite (dropping such a tail) goes to a temporary file beside it, fsynced, renamed over
  the original, and the folder fsynced: a kill at any step leaves the old file or the new one,
  whole (`vizkit.runs.write_atomically`, which every file vizkit writes goes through).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path

from .runs.files import synced, write_atomically  # stdlib only: the journal imports alone

__all__ = ["Journal"]


class Journal:
    """The journal at ``path`` of ``kind`` (e.g. "evaluation") and ``config`` (a JSON-able
    dict; a journal of another config is refused naming the keys that differ). ``entries``
    holds what an earlier run wrote; ``valid(entry)`` says whether a parsed line is a complete
    entry. Use as a context manager: it holds the lock until closed.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl"
    >>> with Journal(path, "example", {"n": 1}) as journal:
    ...     journal.append({"step": 0})
    >>> with Journal(path, "example", {"n": 1}) as journal:
    ...     journal.entries
    [{'step': 0}]
    """

    def __init__(
        self, path: str | Path, kind: str, config: dict,
        valid: Callable[[dict], bool] = lambda entry: isinstance(entry, dict),
    ) -> None:  # fmt: skip
        self.path, self.kind = Path(path), kind
        self.config = json.loads(json.dumps(config))  # as it reads back (tuples as lists)
        self.header = {"vizkit": kind, "config": self.config}
        self._lock = _lock(self.path)
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):  # a killed rewrite's
            stale.unlink(missing_ok=True)
        try:
            self.entries = self._read(valid)
        except BaseException:
            self.close()
            raise

    def append(self, entry: dict) -> None:
        """Write ``entry`` as one line, flushed and fsynced before returning."""
        with self.path.open("a") as file:
            file.write(json.dumps(entry) + "\n")
            synced(file)

    def close(self) -> None:
        """Release the lock (the journal stays as written)."""
        if self._lock is not None:
            os.close(self._lock)  # closing releases the lock
            self._lock = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, valid: Callable[[dict], bool]) -> list[dict]:
        """The entries of an existing journal (checked to be ours and of this config), a new
        one's header written; a damaged tail is dropped by an atomic rewrite."""
        data = self.path.read_bytes() if self.path.exists() else b""
        if not data:
            write_atomically(self.path, (json.dumps(self.header) + "\n").encode())
            return []
        lines = data.split(b"\n")
        header = _header(lines[0])
        if header is None or header.get("vizkit") != self.kind:
            raise ValueError(
                f"{self.path} is not a vizkit {self.kind} file (its first line is no "
                f'{{"vizkit": "{self.kind}", ...}} header), so vizkit will not write to it: '
                "pass another file, or move this one away."
            )
        if header.get("config") != self.config:
            stored = header.get("config") or {}
            differ = sorted(
                k for k in {*stored, *self.config} if stored.get(k) != self.config.get(k)
            )
            raise ValueError(
                f"{self.path} was written with other {self.kind} settings ({', '.join(differ)} "
                "differ); pass another file, or delete it to start over."
            )
        entries, complete = [], 1
        for line in lines[1:]:
            entry = _parsed(line)
            if entry is None or not valid(entry):
                break
            entries.append(entry)
            complete += 1
        kept = b"".join(line + b"\n" for line in lines[:complete])
        if kept != data:  # a cut or damaged tail: drop it, atomically
            dropped = len([line for line in lines[complete:] if line.strip()])
            warnings.warn(
                f"{self.path}: {dropped} damaged or cut line(s) at the end dropped (a run was "
                "killed while writing); their work is done again.",
                stacklevel=3,
            )
            write_atomically(self.path, kept)
        return entries


def _header(line: bytes) -> dict | None:
    """The header in a journal's first line, or None when it is not one (any other file)."""
    if not line.startswith(b'{"vizkit": '):
        return None
    parsed = _parsed(line)
    return parsed if isinstance(parsed, dict) else None


def _parsed(line: bytes) -> object | None:
    """One JSON line, or None when it is cut short, damaged or not text."""
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _lock(path: Path) -> int:
    """An exclusive lock on ``path``'s sidecar ``<name>.lock`` (holding this pid), or a refusal
    naming the process that holds it (POSIX locks: Linux, macOS)."""
    import fcntl

    lock = path.with_name(f"{path.name}.lock")
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip() or "another"
        os.close(descriptor)
        raise RuntimeError(
            f"{path} is being written by process {holder} (it holds {lock}); two runs writing "
            "one file would lose each other's work. Wait for it, or pass another file."
        ) from None
    with contextlib.suppress(OSError):
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, str(os.getpid()).encode(), 0)
    return descriptor
