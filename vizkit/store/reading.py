"""`ActivationStore`: one layer of an activation store (`vizkit.store.writing`) as a
``torch.utils.data.Dataset`` of rows (C,), read through ``numpy.memmap``: nothing is loaded
until read, and `batches` reads consecutive rows, one sequential read per shard."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..hooks import HookedModel
from ..runs import tensor_fingerprint
from .manifest import DTYPES, differences, model_identity, read_manifest
from .shards import shard_count, shard_problem, shard_rows

__all__ = ["ActivationStore"]

RESUME = (
    "Run vk.cache_activations again with the same arguments: it writes missing shards and "
    "rewrites damaged ones, keeping the rest."
)


class ActivationStore(Dataset):
    """The rows of one stored layer, image by image, each image's kept tokens in order.

    Attributes:
        folder: the store's folder; ``manifest``: its manifest (settings, layers, shards).
        name: the layer's hook name; ``width``: C; ``tokens_per_image``: T.
        prefix_tokens, grid: the layer's token layout (prefix tokens, then a (gh, gw) grid
            of patches, row-major; None in stores written before they were recorded).
        frames: a video model's token frames T' (its patches T' x gh x gw, frame-major);
            None for images.
        dtype: the stored dtype (rows are returned in it).
    """

    def __init__(self, folder: str | Path, layer: str | None = None) -> None:
        self.folder = Path(folder)
        manifest = read_manifest(self.folder)
        if manifest is None:
            raise FileNotFoundError(f"No activation store in {self.folder} (no manifest.json).")
        self.manifest = manifest
        layers = list(manifest["layers"])
        name = layers[0] if layer is None else layer
        if name not in layers:
            raise KeyError(f"The store holds {layers}; no layer {name!r}.")
        self.name, self._index = name, layers.index(name)
        spec = manifest["layers"][name]
        self.width, self.tokens_per_image = spec["width"], spec["tokens_per_image"]
        self.prefix_tokens = spec.get("prefix_tokens")
        self.grid = tuple(spec["grid"]) if spec.get("grid") else None
        self.frames = spec.get("frames")
        self.dtype = getattr(torch, manifest["settings"]["dtype"])
        self._check_complete()
        per_shard = manifest["shard_images"] * self.tokens_per_image
        self._starts = list(range(0, len(self), per_shard))
        self._rows: list[np.memmap | None] = [None] * len(self._starts)

    def __len__(self) -> int:
        return self.manifest["images"] * self.tokens_per_image

    def __getitem__(self, row: int) -> Tensor:
        """Row ``row`` (C,)."""
        if not -len(self) <= row < len(self):
            raise IndexError(f"row {row} out of range for a store of {len(self)} rows.")
        row %= len(self)
        shard = bisect.bisect_right(self._starts, row) - 1
        return self._as_tensor(self._shard(shard)[row - self._starts[shard]])

    def rows(self, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` (n, C), read in order."""
        start, stop, _ = slice(start, stop).indices(len(self))
        parts = []
        while start < stop:
            shard = bisect.bisect_right(self._starts, start) - 1
            offset = self._starts[shard]
            end = min(stop, offset + len(self._shard(shard)))
            parts.append(self._as_tensor(self._shard(shard)[start - offset : end - offset]))
            start = end
        return torch.cat(parts) if parts else torch.empty(0, self.width, dtype=self.dtype)

    def batches(self, batch_size: int) -> Iterator[Tensor]:
        """Consecutive rows (n, C), ``batch_size`` at a time (the last may be shorter)."""
        for start in range(0, len(self), batch_size):
            yield self.rows(start, start + batch_size)

    def positions(self) -> Tensor:
        """(images, T) int64: the token position of each stored row, image by image."""
        parts = [self._positions(s) for s in range(len(self._starts))]
        return torch.from_numpy(np.concatenate(parts)).long()

    def image_of(self, row: int) -> tuple[int, int]:
        """(image index in the data, token position) of row ``row``."""
        if not -len(self) <= row < len(self):
            raise IndexError(f"row {row} out of range for a store of {len(self)} rows.")
        row %= len(self)
        shard = bisect.bisect_right(self._starts, row) - 1
        image, token = divmod(row - self._starts[shard], self.tokens_per_image)
        first = self._starts[shard] // self.tokens_per_image
        return first + image, int(self._positions(shard)[image, token])

    def image_rows(self, image: int) -> tuple[Tensor, Tensor]:
        """(T, C) the rows of image ``image`` of the data, and (T,) their token positions."""
        if not 0 <= image < self.manifest["images"]:
            raise IndexError(f"image {image} out of range for a store of "
                             f"{self.manifest['images']} images.")  # fmt: skip
        shard, index = divmod(image, self.manifest["shard_images"])
        positions = torch.from_numpy(np.array(self._positions(shard)[index])).long()
        start = image * self.tokens_per_image
        return self.rows(start, start + self.tokens_per_image), positions

    def layer(self, name: str) -> ActivationStore:
        """Another layer of the same store."""
        return ActivationStore(self.folder, name)

    def check(self, model: nn.Module | HookedModel, **settings: object) -> None:
        """Refuse this store for ``model`` (a model of other weights) or for other
        ``settings`` (manifest keys: tokens, dtype, image_size, ...), naming the difference."""
        model = model.model if isinstance(model, HookedModel) else model
        stored = self.manifest["settings"]
        asked = {"model": model_identity(model), **settings}
        changed = differences({k: stored.get(k) for k in asked}, asked)
        if changed:
            raise ValueError(
                f"The activation store {self.folder} was not made with this model or these "
                f"settings ({'; '.join(changed)}; stored -> given). Write a store for them "
                "with vk.cache_activations."
            )

    def check_images(self, images: Tensor) -> None:
        """Refuse ``images`` (N, C, H, W) that are not the store's data in its order (their
        count, and the hashes of the images the manifest sampled)."""
        data = self.manifest["settings"]["data"]
        if len(images) != data["images"]:
            raise ValueError(
                f"The store {self.folder} holds {data['images']} images; {len(images)} were "
                "given. Pass the images the store was written from, in the same order."
            )
        wrong = [int(i) for i, digest in data["sampled"].items()
                 if tensor_fingerprint(images[int(i)]) != digest]  # fmt: skip
        if wrong:
            raise ValueError(
                f"Images {wrong} differ from the ones the store {self.folder} was written "
                "from (their hashes): pass the same images, in the same order and "
                "normalization."
            )

    def __repr__(self) -> str:
        return (
            f"ActivationStore({self.name}: {self.manifest['images']} images x "
            f"{self.tokens_per_image} tokens x {self.width}, {self.manifest['settings']['dtype']})"
        )

    def verify(self) -> None:
        """Read every file of the store and compare it with the SHA-1 its shard's marker
        recorded; a damaged shard is refused, naming it and the fix (a resume rewrites it)."""
        self._check_complete(checksums=True)

    def _check_complete(self, checksums: bool = False) -> None:
        """Refuse a store with a shard not written, or one whose files are not the size the
        manifest implies (cut short or enlarged after a crash, a manifest edited by hand)."""
        shards = shard_count(self.manifest)
        problems = {s: shard_problem(self.folder, self.manifest, s, checksums)
                    for s in range(shards)}  # fmt: skip
        beyond = sorted(int(p.stem) for p in (self.folder / "shards").glob("*.json")
                        if p.stem.isdigit() and int(p.stem) >= shards)  # fmt: skip
        if beyond:  # a manifest that lost images (edited by hand)
            problems[beyond[0]] = (f"it is beyond the {shards} shards of the manifest's "
                                   f"{self.manifest['images']} images")  # fmt: skip
        missing = [s for s, p in problems.items() if p == "not written"]
        damaged = {s: p for s, p in problems.items() if p not in (None, "not written")}
        if damaged:
            named = "; ".join(f"shard {s}: {p}" for s, p in list(damaged.items())[:5])
            raise ValueError(f"The activation store {self.folder} is damaged ({named}). {RESUME}")
        if missing:
            raise ValueError(
                f"The activation store {self.folder} is incomplete: shards {missing[:10]} of "
                f"{shards} are not written. {RESUME}"
            )

    def _file(self, shard: int, kind: str) -> Path:
        return self.folder / f"layer{self._index}" / f"{shard:05d}.{kind}"

    def _shard(self, shard: int) -> np.memmap:
        if self._rows[shard] is None:
            numpy_dtype = DTYPES[self.manifest["settings"]["dtype"]]
            rows = shard_rows(self.manifest, self.name, shard)  # the file's size was checked
            self._rows[shard] = np.memmap(self._file(shard, "bin"), numpy_dtype, "r",
                                          shape=(rows, self.width))  # fmt: skip
        return self._rows[shard]

    def _positions(self, shard: int) -> np.memmap:
        file = self._file(shard, "pos")
        return np.memmap(file, np.int32, "r").reshape(-1, self.tokens_per_image)

    def _as_tensor(self, rows: np.ndarray) -> Tensor:
        tensor = torch.from_numpy(np.array(rows))  # a copy: the memmap stays read-only
        return tensor.view(torch.bfloat16) if self.dtype == torch.bfloat16 else tensor
