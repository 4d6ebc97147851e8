"""A store's shards on disk: the files each holds and their sizes as the manifest implies them,
the marker written last (each file's size and SHA-1), and the check that a shard is whole.

A shard is trusted only when its marker exists and every file has the size the manifest
implies (images x tokens x width x item size), the size its marker recorded and, where asked
(on resume, `ActivationStore.verify`), the marker's SHA-1: a file cut short or enlarged after
a crash, or a manifest edited by hand, is found before a byte of it is read.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..runs import write_json
from .manifest import DTYPES

__all__ = ["expected_files", "shard_count", "shard_problem", "shard_rows", "write_marker"]

CHUNK = 1 << 24  # bytes hashed at a time


def shard_count(manifest: dict) -> int:
    """How many shards the manifest's images fill."""
    return -(-manifest["images"] // manifest["shard_images"])


def shard_images(manifest: dict, shard: int) -> int:
    """How many images shard ``shard`` holds."""
    per_shard, images = manifest["shard_images"], manifest["images"]
    return max(0, min(per_shard, images - shard * per_shard))


def shard_rows(manifest: dict, layer: str, shard: int) -> int:
    """The rows of ``layer`` in shard ``shard``: its images x the layer's tokens per image."""
    return shard_images(manifest, shard) * manifest["layers"][layer]["tokens_per_image"]


def expected_files(manifest: dict, shard: int) -> dict[str, int]:
    """{path inside the store: its size in bytes} of every file of shard ``shard``."""
    item = np.dtype(DTYPES[manifest["settings"]["dtype"]]).itemsize
    files = {}
    for i, (name, spec) in enumerate(manifest["layers"].items()):
        rows = shard_rows(manifest, name, shard)
        files[f"layer{i}/{shard:05d}.bin"] = rows * spec["width"] * item
        files[f"layer{i}/{shard:05d}.pos"] = rows * np.dtype(np.int32).itemsize
    return files


def marker(folder: Path, shard: int) -> Path:
    return folder / "shards" / f"{shard:05d}.json"


def write_marker(folder: Path, shard: int, images: range, files: dict[str, dict]) -> None:
    """Mark shard ``shard`` done (after its files): its images, and each file's size and
    SHA-1 (``files``: path inside the store -> {"bytes": ..., "sha1": ...})."""
    write_json(marker(folder, shard), {"shard": shard, "images": [images.start, images.stop],
                                       "files": files})  # fmt: skip


def shard_problem(folder: Path, manifest: dict, shard: int, checksums: bool = False) -> str | None:
    """Why shard ``shard`` of the store in ``folder`` cannot be trusted, or None: not written
    (no marker), a damaged marker, a file missing or of another size than the manifest implies
    or the marker recorded, or (``checksums``) of other bytes than the marker's SHA-1."""
    try:
        written = json.loads(marker(folder, shard).read_text())
        recorded, images = written.get("files", {}), written["images"]
    except FileNotFoundError:
        return "not written"
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, KeyError, TypeError):
        return f"its marker {marker(folder, shard).name} is damaged"
    first = shard * manifest["shard_images"]
    if images != [first, first + shard_images(manifest, shard)]:
        return (f"its marker holds images {images} where the manifest implies "
                f"{[first, first + shard_images(manifest, shard)]}")  # fmt: skip
    for path, size in expected_files(manifest, shard).items():
        file = folder / path
        if not file.is_file():
            return f"{path} is missing"
        found = file.stat().st_size
        if found != size:
            return f"{path} holds {found} bytes where the manifest implies {size}"
        entry = recorded.get(path)  # markers written before this check record no files
        if entry is not None and entry.get("bytes") != found:
            return f"{path} holds {found} bytes where its marker recorded {entry.get('bytes')}"
        if checksums and entry is not None and _sha1(file) != entry.get("sha1"):
            return f"{path} does not hold the bytes its marker recorded (SHA-1 differs)"
    return None


def _sha1(file: Path) -> str:
    digest = hashlib.sha1()
    with file.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
