"""`cache_activations`: run a model over a data set once and write the chosen activations to
disk, shard by shard, resumable and sharded across ``torchrun`` processes.

A store is a folder: ``manifest.json``, and per layer ``layer<i>/<shard>.bin`` (the kept tokens'
rows, (images x tokens, width), C order, in the store's dtype) with ``layer<i>/<shard>.pos``
(int32 (images, tokens), each row's token position), and ``shards/<shard>.json`` once every file
of a shard is in place, recording each file's size and SHA-1 (`vizkit.store.shards`; files are
written whole or not at all through `vizkit.runs`). A resume reads every written shard against
its marker and rewrites one that is damaged; a reader checks each file's size. Plain binary
arrays are read with ``numpy.memmap``: a batch of consecutive rows is one sequential read, with
nothing to decode and no library beside numpy.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset
from tqdm.auto import tqdm

from ..analysis.representations import token_stream_layers
from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count, check_images, model_device
from ..hooks.selector import LayerSpec, select_layers
from ..processes import process_group
from ..runs import replaced_whole, tensor_fingerprint, write_json
from .manifest import (
    FORMAT,
    StoreSettings,
    differences,
    model_identity,
    preprocessing_of,
    read_manifest,
)
from .reading import ActivationStore
from .shards import shard_problem, write_marker
from .tokens import TokenChoice, check_tokens, token_positions

__all__ = ["cache_activations"]

DEFAULT_SHARD_BYTES = 256 * 2**20


@analysis_contract(videos=True)
def cache_activations(
    model: nn.Module | HookedModel,
    data: object,
    out: str | Path,
    layers: LayerSpec | None = None,
    tokens: TokenChoice = "patches",
    dtype: torch.dtype = torch.float32,
    batch_size: int = 32,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    seed: int = 0,
    progress: bool = True,
) -> ActivationStore:
    """Write the activations of ``layers`` over every image of ``data`` to the store ``out``.

    Args:
        data: a Dataset of images (C, H, W) or of tuples whose first item is one (labels are
            not stored), a tuple of tensors, a DataLoader that does not shuffle (its dataset
            is read), or "shapes" (the shipped Shapes sample), in the model's normalization.
        out: the store's folder. A folder holding a store of the same settings resumes it
            (finished shards are kept); one of other settings is refused, naming them.
        layers: block outputs (`vizkit.hooks.select_layers`: ints count the transformer
            blocks whose outputs are tokens on a grid, negative from the end), or hook names
            and globs of any token activation (B, N, C); default the last block's output.
        tokens: "patches", "all", "class", "registers", or k: k random patches per image
            (drawn from ``seed`` and the image's index).
        dtype: float32, float16 or bfloat16, as stored.
        batch_size: images per forward.
        shard_bytes: the most one shard's files hold (all layers); each batch's rows are
            appended as they come, and a shard counts once its files are whole.
        progress: a progress bar over the shards' images.

    Returns:
        The `ActivationStore` (the first of ``layers``; ``store.layer(name)`` for another).

    Under ``torchrun`` each process writes every WORLD_SIZE-th shard and the first writes the
    manifest; every process returns the store once all shards are in place.
    """
    images = _images(data)
    batch_size = check_count("batch_size", batch_size)
    shard_bytes = check_count("shard_bytes", shard_bytes)
    tokens = check_tokens(tokens)
    seed = check_count("seed", seed, 0)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"dtype must be torch.float32, float16 or bfloat16; got {dtype!r}.")
    first = check_images(model.model, _image(images[0])[None].to(model_device(model.model)))
    image_size = tuple(first.shape[-2:])
    names = _layers(model, layers, image_size)
    widths = _widths(model, first, names)
    layouts = {name: model.token_layout(image_size, name) for name in names}
    per_image = {
        name: token_positions(tokens, layouts[name], torch.zeros(1), seed, name).shape[1]
        for name in names
    }
    row_bytes = sum(per_image[n] * widths[n] for n in names) * torch.finfo(dtype).bits // 8
    settings = StoreSettings(
        model=model_identity(model.model),
        layers=tuple(names),
        tokens=tokens,
        seed=seed,
        dtype=str(dtype).removeprefix("torch."),
        image_size=image_size,
        preprocessing=preprocessing_of(model.model),
        data=_data_identity(images),
    ).to_json()
    manifest = {
        "format": FORMAT, "settings": settings, "images": len(images),
        "shard_images": max(1, shard_bytes // row_bytes),
        "layers": {n: _layer_spec(layouts[n], widths[n], per_image[n]) for n in names},
    }  # fmt: skip
    folder = _prepared(Path(out), manifest)
    world, rank = process_group()
    shards = _shards(len(images), manifest["shard_images"])
    todo = [s for s in range(len(shards)) if s % world == rank
            and _needs_writing(folder, manifest, s)]  # fmt: skip
    bar = tqdm(total=sum(len(shards[s]) for s in todo), disable=not progress, unit="image",
               desc="cache_activations")  # fmt: skip
    for shard in todo:
        _write_shard(model, images, shard, shards[shard], manifest, folder, batch_size, bar)
    bar.close()
    if world > 1:
        dist.barrier()
    return ActivationStore(folder)


def _images(data: object) -> Dataset:
    """The data as a Dataset read by index (see `cache_activations`)."""
    dataset = _as_dataset(data)
    if len(dataset) == 0:
        raise ValueError("data is empty: there is nothing to store.")
    return dataset


def _as_dataset(data: object) -> Dataset:
    if isinstance(data, str):
        if data != "shapes":
            raise ValueError(f"data must be 'shapes', a Dataset or a DataLoader; got {data!r}.")
        from ..datasets import load_sample

        return TensorDataset(load_sample()[0])
    if isinstance(data, Tensor):
        return TensorDataset(data)
    if isinstance(data, tuple):
        return TensorDataset(*data)
    if isinstance(data, DataLoader):
        if not isinstance(data.sampler, torch.utils.data.SequentialSampler):
            raise ValueError(
                "The DataLoader does not read its dataset in order (it shuffles or samples); a "
                "store's rows are numbered by image. Pass its dataset, or shuffle=False."
            )
        data = data.dataset
    if not isinstance(data, Dataset) or not hasattr(data, "__len__"):
        raise TypeError(
            "data must be a Dataset with a length, a DataLoader over one, a tensor or tuple "
            f"of tensors, or 'shapes'; got {type(data).__name__}."
        )
    return data


def _layer_spec(layout: TokenLayout, width: int, tokens: int) -> dict:
    """A stored layer's manifest entry: its width, tokens kept per image and token layout (a
    video's token frames T' where it has them)."""
    spec = {"width": width, "tokens_per_image": tokens,
            "prefix_tokens": layout.num_prefix_tokens, "grid": list(layout.grid)}  # fmt: skip
    return spec if layout.frames is None else {**spec, "frames": layout.frames}


def _image(item: object) -> Tensor:
    """The image (C, H, W), or a video model's clip (T, C, H, W), of one item of the data set
    (checked against the model by `check_images`)."""
    if isinstance(item, dict):
        raise TypeError(
            f"The data yields dicts (keys {', '.join(map(str, item))}); cache_activations takes "
            "images or (image, ...) tuples. Wrap the dataset so each item is one, e.g. "
            "item['pixel_values']."
        )
    image = item[0] if isinstance(item, (tuple, list)) else item
    if not isinstance(image, Tensor) or image.ndim not in (3, 4):
        got = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
        raise TypeError(
            f"Each item's image must be a (C, H, W) tensor (a video model's clip: (T, C, H, W)); "
            f"got {got}."
        )
    return image


def _layers(hm: HookedModel, layers: LayerSpec | None, image_size: tuple[int, int]) -> list[str]:
    """The hook names stored: ints count the block outputs with tokens on a grid; names and
    globs may pick any token activation (checked on the first image by `_widths`)."""
    names = token_stream_layers(hm, image_size)
    if layers is None:
        return names[-1:]
    return select_layers(layers, names, hm.hook_names(), what="block outputs")


def _widths(hm: HookedModel, first: Tensor, names: Sequence[str]) -> dict[str, int]:
    """Each layer's channel count, from one image's forward; refuses what is not tokens
    (B, N, C) of the layer's token layout."""
    with torch.no_grad():
        _, cache = hm.run_with_cache(first, names=list(names))
    widths = {}
    for name in names:
        layout = hm.token_layout(tuple(first.shape[-2:]), name)
        shape = tuple(cache[name].shape)
        if len(shape) != 3 or layout is None or shape[1] != layout.num_tokens:
            expected = "" if layout is None else f" with {layout.num_tokens} tokens"
            raise ValueError(
                f"{name} is {shape}, not tokens (B, N, C){expected}: a store keeps token "
                "activations (block outputs, branch outputs, MLP hidden layers)."
            )
        widths[name] = shape[-1]
    return widths


def _data_identity(images: Dataset) -> dict:
    """What identifies the data: its class, length, and a hash of its first, middle and last
    images (a change elsewhere in it goes unseen)."""
    count = len(images)
    picks = sorted({0, count // 2, count - 1})
    return {
        "class": type(images).__qualname__,
        "images": count,
        "sampled": {str(i): tensor_fingerprint(_image(images[i])) for i in picks},
    }


def _prepared(folder: Path, manifest: dict) -> Path:
    """``folder`` with ``manifest`` in it: written for a new store, compared for an existing
    one (a store of other settings is refused, naming each difference). The first process
    decides, and tells the others, so that every process stops or none does."""
    world, rank = process_group()
    problem = _prepare(folder, manifest) if rank == 0 else None
    if world > 1:
        told = [problem]
        dist.broadcast_object_list(told, src=0)
        problem = told[0]
    if problem is not None:
        raise ValueError(problem)
    return folder


def _prepare(folder: Path, manifest: dict) -> str | None:
    """Write or compare the manifest; why the folder cannot take it, or None."""
    if folder.exists() and not folder.is_dir():
        return f"out={str(folder)!r} is a file; a store is a folder: pass a new folder's path."
    found = read_manifest(folder) if folder.is_dir() else None
    if found is not None:
        changed = differences(found, manifest)
        if changed:
            return (
                f"{folder} holds an activation store of other settings ({'; '.join(changed)}; "
                "stored -> asked). Write to another folder, or delete this one."
            )
        return None
    if folder.is_dir() and any(folder.iterdir()):
        return f"{folder} exists and is not an activation store; pick an empty folder."
    (folder / "shards").mkdir(parents=True, exist_ok=True)
    for i in range(len(manifest["layers"])):
        (folder / f"layer{i}").mkdir(exist_ok=True)
    write_json(folder / "manifest.json", manifest)
    return None


def _shards(count: int, per_shard: int) -> list[range]:
    return [range(start, min(start + per_shard, count)) for start in range(0, count, per_shard)]


def _write_shard(
    hm: HookedModel, images: Dataset, shard: int, indices: range, manifest: dict, folder: Path,
    batch_size: int, bar: tqdm,
) -> None:  # fmt: skip
    """Run the shard's images, appending each batch's rows to the shard's files as it comes
    (nothing held beyond a batch; the disk writes while the next batch runs), then rename
    the files into place and write the marker."""
    settings, layers = manifest["settings"], manifest["layers"]
    dtype = getattr(torch, settings["dtype"])
    paths = {name: (f"layer{i}/{shard:05d}.bin", f"layer{i}/{shard:05d}.pos")
             for i, name in enumerate(layers)}  # fmt: skip
    try:
        with ExitStack() as files:
            partials = {path: files.enter_context(replaced_whole(folder / path))
                        for pair in paths.values() for path in pair}  # fmt: skip
            out = {path: _HashedFile(files.enter_context(partial.open("wb")))
                   for path, partial in partials.items()}  # fmt: skip
            loader = DataLoader(Subset(images, indices), batch_size=batch_size, shuffle=False)
            done = 0
            for batch in loader:
                x = check_images(hm.model, _batch_images(batch).to(model_device(hm.model)),
                                 first=indices.start + done)  # fmt: skip
                index = torch.arange(indices.start + done, indices.start + done + len(x))
                with torch.no_grad():
                    _, cache = hm.run_with_cache(x, names=list(layers))
                for name in layers:
                    layout = hm.token_layout(tuple(x.shape[-2:]), name)
                    kept = token_positions(settings["tokens"], layout, index, settings["seed"],
                                           name)  # fmt: skip
                    rows = _kept_rows(cache[name], kept)
                    _check_finite(rows, dtype, name, index)
                    out[paths[name][0]].write(_as_stored(rows.flatten(0, 1), dtype))
                    out[paths[name][1]].write(kept.numpy().astype(np.int32))
                done += len(x)
                bar.update(len(x))
            written = {path: file.summary() for path, file in out.items()}
        write_marker(folder, shard, indices, written)  # last: the shard counts once all are in
    except OSError as error:  # numpy's "32768 requested and 16384 written" on a full disk
        raise OSError(
            error.errno,
            f"Writing shard {shard} of the store {folder} failed ({error}): the disk is full "
            "or the folder is not writable. The finished shards are kept: free space and run "
            "the same call again to resume.",
        ) from error


class _HashedFile:
    """A file written array by array, with its byte count and SHA-1 kept as it grows."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle, self.bytes, self.sha1 = handle, 0, hashlib.sha1()

    def write(self, array: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(array)).cast("B")
        self.handle.write(data)
        self.sha1.update(data)
        self.bytes += len(data)

    def summary(self) -> dict:
        """{"bytes": ..., "sha1": ...}, as the shard's marker records the file."""
        return {"bytes": self.bytes, "sha1": self.sha1.hexdigest()}


def _kept_rows(activations: Tensor, kept: Tensor) -> Tensor:
    """(B, T, C) the ``kept`` (B, T) token positions of ``activations`` (B, N, C); the
    activations themselves where every token is kept in order."""
    every = torch.arange(activations.shape[1])
    if kept.shape[1] == len(every) and bool((kept == every).all()):
        return activations
    index = kept[..., None].expand(-1, -1, activations.shape[-1]).to(activations.device)
    return activations.gather(1, index)


def _needs_writing(folder: Path, manifest: dict, shard: int) -> bool:
    """Whether shard ``shard`` is to be written: not written yet, or damaged (its files read
    and compared with its marker's sizes and SHA-1s; a damaged one is named, then rewritten)."""
    problem = shard_problem(folder, manifest, shard, checksums=True)
    if problem not in (None, "not written"):
        warnings.warn(f"{folder}: shard {shard} is damaged ({problem}); writing it again.",
                      stacklevel=3)  # fmt: skip
    return problem is not None


def _check_finite(rows: Tensor, dtype: torch.dtype, layer: str, index: Tensor) -> None:
    """Refuse (B, T, C) activations of images ``index`` (data indices) that are not finite,
    or that ``dtype`` cannot hold (float16 overflows to inf past 65504), before a row is
    stored."""
    low, high = torch.aminmax(rows) if rows.numel() else (rows.new_zeros(()),) * 2
    if not bool(low.isfinite() & high.isfinite()):  # NaN and inf reach the minimum or maximum
        bad = index[~rows.isfinite().flatten(1).all(1).cpu()].tolist()
        raise ValueError(
            f"{layer}: the model's activations are not finite (NaN or inf) on images "
            f"{bad[:10]} of the data (data indices); nothing of them was stored. Check those "
            "images and the model (e.g. vk.HookedModel(model).run_with_cache on one of them)."
        )
    largest = max(-float(low), float(high))  # NaN and inf propagate into min and max
    if largest > torch.finfo(dtype).max:
        image = int(index[rows.abs().flatten(1).amax(1).argmax().cpu()])
        raise ValueError(
            f"{layer}: an activation of {largest:.4g} (image {image} of the data) exceeds "
            f"{str(dtype).removeprefix('torch.')}'s largest value {torch.finfo(dtype).max:.4g}: "
            "it would be stored as inf. Pass dtype=torch.bfloat16 (float32's range) or "
            "torch.float32."
        )


def _as_stored(rows: Tensor, dtype: torch.dtype) -> np.ndarray:
    """(n, C) rows cast to ``dtype`` as the numpy array written (bfloat16 as its raw bits)."""
    rows = rows.to(dtype).cpu()
    if dtype == torch.bfloat16:
        return rows.view(torch.int16).numpy().view(np.uint16)
    return rows.numpy()


def _batch_images(batch: object) -> Tensor:
    return batch[0] if isinstance(batch, (tuple, list)) else batch
