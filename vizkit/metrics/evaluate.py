"""`vk.evaluate`: saliency methods scored by metrics over a whole data set, batch by batch, with
every (batch, method) result appended to a file as soon as it is computed, so that a run killed
at any point resumes where it stopped: nothing computed is lost, nothing is counted twice."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..datasets.labelled import checked_labels, labelled_batches, labels_in_memory
from ..hooks import HookedModel
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice, check_count
from ..hooks.scores import (
    ScoreTarget,
    is_score_target,
    model_logits,
    require_class_logits,
    target_label,
)
from ..journal import Journal
from ..prefetch import read_ahead
from ..processes import process_group
from ..runs import model_fingerprint
from .chance import certainty
from .compare import resolve_methods
from .faithfulness import LEVELS, CurveScoring, batch_images, curve_steps, unit_count
from .localization import mask_shape
from .registry import selected_metrics
from .scoring import MethodScores, curve_ends, keyed_notes, score_methods
from .table import SaliencyTable

__all__ = ["evaluate"]


def _target_record(targets: object, out: str | Path | None) -> object:
    """What the log's header records of ``targets``, so that a resume with another target is
    refused: "labels" / "predictions", or a score target's label and a hash of its tensors (two
    references of one label differ there). A plain callable has no content to check, so it
    is refused with ``out``."""
    if not isinstance(targets, ScoreTarget):
        if is_score_target(targets) and out is not None:
            raise ValueError(
                "A resumable evaluation (out=) records its target to refuse a resume with "
                "another; a plain callable cannot be checked. Pass a vizkit.targets helper "
                "(e.g. targets=vk.targets.embedding_norm()), or leave out=."
            )
        return target_label(targets)
    digest = hashlib.sha1(type(targets).__qualname__.encode())
    for name, value in sorted(vars(targets).items()):
        if isinstance(value, Tensor):
            digest.update(name.encode())
            digest.update(value.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, (str, int, float, bool)):
            digest.update(f"{name}={value!r}".encode())
    return f"{targets.label} ({digest.hexdigest()[:12]})"


@analysis_contract(videos=True)
def evaluate(
    model: nn.Module | HookedModel,
    data: object,
    methods: str | Sequence[str | tuple[str, Callable]] = "default",
    metrics: str | Sequence[str] = "all",
    out: str | Path | None = None,
    batch_size: int = 16,
    targets: str | Callable = "labels",
    progress: bool = True,
    level: str = "patch",
    steps: int | None = None,
) -> SaliencyTable:
    """Score ``methods`` by ``metrics`` on every image of ``data``: `compare_saliency`'s
    scoring (`vizkit.metrics.scoring`) on each batch, journaled.

    Args:
        data: a Dataset or DataLoader of ``(images, labels[, masks])``, a tuple of such
            tensors, or "shapes" (the shipped Shapes sample, with object masks). A Dataset is
            read in order, ``batch_size`` images at a time.
        methods: names of `vizkit.methods.METHODS` or ``(name, fn(model, x, targets))`` pairs;
            "default" or "all" as `compare_saliency`.
        metrics: names of `vizkit.metrics.METRICS`; "all" (the default): every one that
            applies (the mask metrics only where the data has masks); "quick": those
            `compare_saliency` scores by default.
        out: a JSON-lines file the results are appended to as they are computed; a run on an
            existing file resumes it (its configuration must match). Under ``torchrun`` every
            process takes every WORLD_SIZE-th batch, appends to ``<out>.rank<r>-of-<n>``, and
            the table is gathered on every process: the one a single process gives.
        targets: "labels" (the data's classes) or "predictions" (the model's); on a backbone
            (no class logits) a score target the same for every image, e.g.
            ``vk.targets.embedding_norm()`` or ``vk.targets.text(clip, "a dog")``: then the
            metrics that score a class's probability (ROAD, average drop, ...) are left out
            by default and refused by name.
        progress: a progress bar over the batches and methods.
        level, steps: the deletion/insertion curves' unit and steps, as in `compare_saliency`.

    Returns:
        `SaliencyTable`: per-image scores, means and standard errors, ranks, seconds (summed
        over the batches, those of a resumed run included) and, for classes, the images whose
        prediction is near chance.
    """
    batch_size = check_count("batch_size", batch_size)
    scored = _check_targets(model, targets)
    chosen = resolve_methods(methods, model)
    check_choice("level", level, LEVELS)
    batches, count = labelled_batches(data, batch_size, "evaluate", resumable=out is not None)
    first = next(iter(batches), None)
    if first is None:
        raise ValueError("data holds no images.")
    has_masks = first[2] is not None
    names = selected_metrics(metrics, has_masks, scored, first[0].ndim == 5)
    steps = curve_steps(steps, unit_count(model.model, tuple(first[0].shape[-2:]), level), level)
    if targets == "labels" and (labels := labels_in_memory(data)) is not None:
        with torch.no_grad():  # every label checked before any work, where all are at hand
            classes = model_logits(model(first[0][:1])).shape[-1]
        checked_labels(labels, classes, 0)
    world, rank = process_group()
    config = {
        "model": model_fingerprint(model.model), "methods": [n for n, _ in chosen],
        "metrics": names, "batch_size": batch_size, "targets": _target_record(targets, out),
        "images": count, "processes": world, "level": level, "steps": steps,
    }  # fmt: skip
    notes: dict[str, str] = {}
    total = None if count is None else math.ceil(count / batch_size) * len(chosen)
    shown = progress and rank == 0
    seen = 0  # images before this batch
    with (_Log(_shard_file(out, world, rank), config) as log,
          tqdm(total=total, initial=len(log.done) * world, desc="evaluate", disable=not shown,
               leave=False) as bar):  # fmt: skip
        rest = read_ahead(batches, model.model, "vizkit-evaluate-prefetch")
        for index, batch in enumerate(itertools.chain([first], rest)):
            start, seen = seen, seen + len(batch[0])
            if index % world != rank:  # another process's batch
                continue
            _check_batch(batch, start)
            images = log.identity(batch)
            todo = [(n, fn) for n, fn in chosen if log.entry(index, n, images) is None]
            if not todo:
                continue
            chance, run = _batch_scores(model, batch, todo, names, targets, start, level, steps)
            for name, method in run:
                log.add(_entry(index, name, method, names, images, chance))
                bar.update(world)  # a resumed bar starts at the done count
    entries = _gathered(list(log.done.values()), world)
    entries = sorted(entries, key=lambda e: e["batch"])
    methods = [n for n, _ in chosen]
    per_image = torch.stack([
        torch.tensor([sum((e["scores"][metric] for e in entries if e["method"] == name), [])
                      for metric in names], dtype=torch.float64)
        for name in methods
    ]).float()  # fmt: skip
    seconds = [math.fsum(e.get("seconds", math.nan) for e in entries if e["method"] == name)
               for name in methods]  # fmt: skip
    for entry in entries:
        for key, note in keyed_notes(entry["method"], entry["notes"]).items():
            notes[key] = f"{notes[key]}; {note}" if key in notes else note
    return SaliencyTable(
        methods, names, per_image, seconds, notes,
        options={"batch_size": batch_size, "targets": target_label(targets),
                 "out": None if out is None else str(out), "level": level, "steps": steps},
        **_certainty([e for e in entries if e["method"] == methods[0]]),
    )  # fmt: skip


def _certainty(entries: list[dict]) -> dict[str, Tensor]:
    """The data's `certainty` from one method's entries in batch order: each records its
    batch's (none where a score target is explained, or in a journal written before entries
    held it)."""
    if not entries or any("certainty" not in e for e in entries):
        return {}
    keys = entries[0]["certainty"]
    return {
        k: torch.tensor(
            sum((e["certainty"][k] for e in entries), []),
            dtype=torch.bool if k == "near_chance" else torch.float32,
        )
        for k in keys
    }


def _batch_scores(
    hm: HookedModel, batch: tuple, methods: list[tuple[str, Callable]], metrics: list[str],
    targets: str | Callable, start: int, level: str, steps: int,
) -> tuple[dict, Iterator[tuple[str, MethodScores]]]:  # fmt: skip
    """The batch's `certainty` of the classes explained (empty for a score target) and each
    method's scores of the batch (its first image the ``start``-th of the data), the curves'
    ends computed once: `score_methods` on the batch's labels, the model's predictions or a
    score target."""
    x, labels, masks = batch
    x = x.to(next(iter(hm.model.parameters()), x).device)
    scoring = CurveScoring.of(targets if is_score_target(targets) else None)
    ends = curve_ends(hm, x, metrics, scoring, batch_images(None, x, hm.model))
    classes, chance = targets, {}
    if not is_score_target(targets):
        classes = ends.logits.argmax(-1)
        if targets == "labels":
            classes = checked_labels(labels, ends.logits.shape[-1], start).to(classes.device)
        chance = {k: v.tolist() for k, v in certainty(ends.logits, classes).items()}
    masks = None if masks is None else masks.to(x.device)
    return chance, score_methods(hm, x, classes, masks, methods, metrics, level, steps, ends)


def _entry(
    index: int, name: str, method: MethodScores, metrics: list[str], images: str, chance: dict
) -> dict:
    """The log entry of batch ``index`` and method ``name``: every image's score per metric,
    why any is missing, the seconds it took and the batch's `certainty` (if any)."""
    notes = dict(method.notes)
    for kind in ("constant maps", "no object"):  # notes naming samples of the batch
        if kind in notes:
            notes[kind] = f"batch {index}: {notes[kind]}"
    scores = {m: method.scores[j].tolist() for j, m in enumerate(metrics)}
    entry = {"batch": index, "method": name, "scores": scores, "notes": notes, "images": images,
             "seconds": method.seconds}  # fmt: skip
    return entry | ({"certainty": chance} if chance else {})


def _check_batch(batch: tuple, start: int) -> None:
    """Refuse non-finite images (named by their place in the data, the batch's first being
    the ``start``-th) and object masks that are not (B, H, W) for the images (B, C, H, W), or
    (B, T, H, W) for clips (B, T, C, H, W)."""
    x, _, masks = batch
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = (~torch.isfinite(x.flatten(1))).any(1).nonzero()[:, 0] + start
        raise ValueError(
            f"Images {bad.tolist()} of the data hold NaN or Inf values; vizkit computes nothing "
            "on non-finite inputs. Check the data pipeline (a division by a zero std, a float16 "
            "overflow) or leave those images out."
        )
    expected, axes = mask_shape(x)
    if masks is not None and tuple(masks.shape) != expected:
        raise ValueError(
            f"The masks of images {start}.. are {tuple(masks.shape)}; they must be {axes} = "
            f"{expected}, one pixel mask per image (per frame of a clip) at its size."
        )


class _Log:
    """What is done, by (batch, method): read from and appended to the `Journal` at ``path``
    (None: kept in memory only). An entry records its batch's ``images`` (a hash of the
    batch's tensors), so a resume on other data or in another order is refused."""

    def __init__(self, path: Path | None, config: dict) -> None:
        self.path, self.done = path, {}
        self.journal = None if path is None else Journal(path, "evaluation", config, _complete)
        for entry in [] if self.journal is None else self.journal.entries:
            self.done.setdefault((entry["batch"], entry["method"]), entry)

    def identity(self, batch: tuple) -> str:
        """A hash of the batch's images, labels and masks ("" when nothing is written)."""
        if self.journal is None:
            return ""
        digest = hashlib.sha1()
        for part in batch:
            if isinstance(part, Tensor):
                part = part.detach().cpu().contiguous()
                digest.update(f"{part.dtype}{tuple(part.shape)}".encode())
                digest.update(part.reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()[:16]

    def entry(self, index: int, method: str, images: str) -> dict | None:
        """The logged entry of batch ``index`` and ``method``, if any, checked to be of the
        same images."""
        entry = self.done.get((index, method))
        if entry is not None and entry["images"] != images:
            raise ValueError(
                f"Batch {index} of the data is not the batch {self.path} scored: other images, "
                "another order or a shuffling loader. Resume with the same data in the same "
                "order, or pass another out."
            )
        return entry

    def add(self, entry: dict) -> None:
        self.done[(entry["batch"], entry["method"])] = entry
        if self.journal is not None:
            self.journal.append(entry)

    def __enter__(self) -> _Log:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.journal is not None:
            self.journal.close()


def _complete(entry: object) -> bool:
    """Whether a parsed log line is a whole entry (not one damaged by hand or a kill)."""
    kinds = {"batch": int, "method": str, "scores": dict, "notes": dict, "images": str}
    return isinstance(entry, dict) and all(isinstance(entry.get(k), t) for k, t in kinds.items())


def _shard_file(out: str | Path | None, world: int, rank: int) -> Path | None:
    """The file this process appends to: ``out`` itself, or under torchrun
    ``<out>.rank<r>-of-<n>`` (each process resumes its own shard)."""
    if out is None:
        return None
    out = Path(out)
    shards = [p.name.rsplit("-of-", 1)[1] for p in out.parent.glob(f"{out.name}.rank*-of-*")]
    counts = {int(n) for n in shards if n.isdigit()} | ({1} if out.exists() else set())
    if counts - {world}:
        raise ValueError(
            f"{out} was written by a run of {', '.join(map(str, sorted(counts)))} process(es) "
            f"and this one has {world}: each process resumes its own share of the batches, so "
            "rerun with the same number of processes (torchrun --nproc_per_node), or pass "
            "another out."
        )
    return out if world == 1 else out.with_name(f"{out.name}.rank{rank}-of-{world}")


def _gathered(entries: list[dict], world: int) -> list[dict]:
    """Every process's entries, on every process (``all_gather_object``)."""
    if world == 1:
        return entries
    parts: list[list[dict]] = [[] for _ in range(world)]
    dist.all_gather_object(parts, entries)
    return [entry for part in parts for entry in part]


def _check_targets(model: HookedModel, targets: object) -> bool:
    """Whether ``targets`` is a score target (one for every image of the data); refuses
    anything else but "labels" and "predictions", and those on a backbone."""
    if is_score_target(targets):
        if getattr(targets, "per_image", False):
            raise ValueError(
                f"targets {target_label(targets)!r} holds one value per image of a batch; over "
                "a data set every image needs the same target (a single reference embedding, "
                "one probe class), or run compare_saliency batch by batch."
            )
        return True
    if targets not in ("labels", "predictions"):
        raise ValueError(
            f"targets must be 'labels', 'predictions' or a score target (vizkit.targets); got "
            f"{targets!r}."
        )
    require_class_logits(model.model, None, "targets")
    return False
