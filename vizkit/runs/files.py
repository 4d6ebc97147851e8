"""Files written whole or not at all: the one place vizkit renames a file.

Each write goes to a temporary file in the destination's folder, is flushed and fsynced,
renamed over the destination (one step on POSIX and Windows), and the folder is fsynced so that
the rename itself survives a power cut. A kill at any step leaves the old file or the new one,
whole; the temporary file is removed when the writer fails.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["replaced_whole", "sync_folder", "synced", "write_atomically", "write_json"]


def write_atomically(path: str | Path, data: bytes | str) -> Path:
    """Replace ``path`` by ``data`` (text is written as UTF-8), whole or not at all."""
    payload = data.encode() if isinstance(data, str) else data
    with replaced_whole(path) as temporary:
        with temporary.open("wb") as handle:
            handle.write(payload)
    return Path(path)


def write_json(path: str | Path, content: object) -> Path:
    """``content`` as indented JSON (a final newline) at ``path``, whole or not at all."""
    return write_atomically(path, json.dumps(content, indent=1) + "\n")


@contextmanager
def replaced_whole(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that takes a path (``torch.save``,
    safetensors' ``save_file``); when the block ends it is fsynced and renamed onto ``path``, and
    the folder fsynced. If the block raises, ``path`` is left as it was."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        yield temporary
        with temporary.open("rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    sync_folder(path.parent)


def synced(handle: IO) -> None:
    """Flush ``handle`` and wait until the disk holds its bytes (an appended journal line)."""
    handle.flush()
    os.fsync(handle.fileno())


def sync_folder(folder: str | Path) -> None:
    """fsync ``folder`` so that the names created or renamed in it persist (a no-op where the
    system cannot open a folder, as on Windows)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except (PermissionError, IsADirectoryError):  # Windows
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
