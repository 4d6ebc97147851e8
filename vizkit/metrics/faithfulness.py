"""Deletion and insertion curves (Petsiuk et al. 2018, RISE, Sec. 4.1) for any saliency map.

Deletion replaces the most salient units first with a baseline and tracks the target class's
probability (a faithful map makes it fall fast: low AUC is good); insertion starts from the
baseline and reveals the most salient units first (high AUC is good). Units are patches or pixels;
a video model's clips (B, T, C, H, W) are cut in space and time, a patch unit spanning a token
frame's tubelet (its maps (B, F, h, w), token frames or frames), a pixel unit one pixel of one
frame.
On a backbone (no class logits) the curves track the score of a `vizkit.targets` target (an
embedding's similarity to a reference, its norm, ...) instead of a probability.

Both run the model under the analysis contract (`vizkit.hooks.contract.analysis`: wrappers
unwrapped, eval mode, its training flags restored) and refuse what would give a wrong curve: bad
images (`vizkit.hooks.inputs.check_images`), maps that do not fit them or hold NaN / Inf
(`vizkit.analysis.saliency_result.saliency_maps`), and options out of range.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.result import Result
from ..analysis.saliency_result import (
    SaliencyResult,
    frame_maps,
    rank_descending,
    saliency_maps,
)
from ..hooks import HookedModel, Target, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice, check_count, check_images, video_input
from ..hooks.passes import available_bytes, images_per_pass
from ..hooks.scores import (
    ScoreTarget,
    call_target,
    is_score_target,
    model_logits,
    select_images,
    target_indices,
)
from .registry import ScoredBatch, metric

__all__ = [
    "BASELINES",
    "LEVELS",
    "CurveEnds",
    "CurveResult",
    "CurveScoring",
    "baseline_images",
    "check_tiles",
    "curve_steps",
    "deletion",
    "insertion",
    "perturbation_curve",
    "scored_classes",
    "unit_count",
    "unit_saliency",
    "unit_frames",
    "unit_size",
]

BASELINES = ("blur", "mean", "zero")
LEVELS = ("patch", "pixel")
DEFAULT_STEPS = 16  # steps of a curve when steps=None (fewer where there are fewer units);
# ``steps=64`` gives a finer AUC at 4x the forward passes
BATCH_PIXELS = 2**19  # pixels per forward pass when batch_size=None: 10 images of 224 x 224
# (a ViT-S's activations of one pass stay near 0.1 GB), 128 of 64 x 64
MAX_BATCH = 256


@dataclass(repr=False)
class CurveResult(Result):
    """A deletion or insertion curve per image.

    Attributes:
        kind: "deletion" (most salient first), "deletion_lerf" (least salient first) or
            "insertion".
        fractions: (S + 1,) share of units removed (deletion) or revealed (insertion).
        scores: (B, S + 1) probability of the target class at each step.
        auc: (B,) area under each curve (trapezoid rule over ``fractions``).
        targets: (B,) the classes scored.
        options: level, baseline, steps, unit size ((rows, cols) of pixels; a clip's
            (frames, rows, cols)).
        layout, image_size: the model's tokens and (H, W) of the images.
    """

    kind: str
    fractions: Tensor
    scores: Tensor
    auc: Tensor
    targets: Tensor
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def rows(self) -> list[dict]:
        """One row per image: its target and area under the curve."""
        return [
            {"image": i, "target": t, "auc": a}
            for i, (t, a) in enumerate(zip(self.targets.tolist(), self.auc.tolist(), strict=True))
        ]


def curve_steps(steps: int | None, units: int, level: str) -> int:
    """The number of steps of a curve over ``units`` units: ``steps`` in [1, units], or
    min(16, units) for None."""
    if steps is None:
        return min(DEFAULT_STEPS, units)
    steps = check_count("steps", steps, 1)
    if steps > units:
        more = " or level='pixel' for one unit per pixel" if level == "patch" else ""
        raise ValueError(
            f"steps={steps} is more than the {units} {level} units of these images (a curve "
            f"removes at least one unit per step). Pass steps <= {units}, steps=None for "
            f"min({DEFAULT_STEPS}, units){more}."
        )
    return steps


def baseline_images(x: Tensor, kind: str) -> Tensor:
    """What removed units are replaced with, (B, C, H, W), in ``x``'s (normalized) space:
    ``"zero"`` zeros (the normalization mean colour), ``"mean"`` each image's channel means,
    ``"blur"`` a Gaussian blur with sigma = side / 16 (RISE's insertion start). Clips
    (B, T, C, H, W): each clip's channel means over all its frames, or each frame blurred."""
    check_choice("baseline", kind, BASELINES)
    if x.ndim == 5:
        if kind == "mean":
            return x.mean((1, 3, 4), keepdim=True).expand_as(x)
        return baseline_images(x.flatten(0, 1), kind).view_as(x)
    if kind == "zero":
        return torch.zeros_like(x)
    if kind == "mean":
        return x.mean((2, 3), keepdim=True).expand_as(x)
    sigma = max(x.shape[-2:]) / 16
    radius = max(1, min(math.ceil(3 * sigma), min(x.shape[-2:]) - 1))
    t = torch.arange(-radius, radius + 1, dtype=x.dtype, device=x.device)
    kernel = torch.exp(-(t**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    channels = x.shape[1]
    rows = kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1)
    out = F.conv2d(F.pad(x, (0, 0, radius, radius), mode="reflect"), rows, groups=channels)
    cols = kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1)
    return F.conv2d(F.pad(out, (radius, radius, 0, 0), mode="reflect"), cols, groups=channels)


def unit_size(
    model: nn.Module | HookedModel, image_size: tuple[int, int], level: str
) -> tuple[int, int]:
    """(rows, cols) of pixels per unit: 1 x 1 pixels, the model's patches (its token grid, of
    any library's family, where that grid tiles the image), else (CNNs, overlapping patch
    embeddings) the cells of an 8 x 8 grid."""
    if check_choice("level", level, LEVELS) == "pixel":
        return 1, 1
    hm = model if isinstance(model, HookedModel) else HookedModel(model)
    layout = hm.token_layout(tuple(image_size))
    if layout is not None and all(s % g == 0 for s, g in zip(image_size, layout.grid, strict=True)):
        return tuple(s // g for s, g in zip(image_size, layout.grid, strict=True))
    return tuple(max(1, s // 8) for s in image_size)


def unit_frames(model: nn.Module | HookedModel, level: str) -> int:
    """Frames of a clip one unit spans: a video model's tubelet at ``level`` "patch" (a token
    frame), 1 at "pixel" and for a model of images."""
    video = video_input(model.model if isinstance(model, HookedModel) else model)
    return video.tubelet if video is not None and level == "patch" else 1


def unit_count(model: nn.Module, image_size: tuple[int, int], level: str) -> int:
    """Units of an (H, W) image at ``level`` ("patch" or "pixel") for ``model``; of a clip of
    the frames a video model takes, over all its frames."""
    unit = unit_size(model, image_size, level)
    check_tiles(image_size, unit, level)
    video = video_input(model.model if isinstance(model, HookedModel) else model)
    frames = 1 if video is None else video.frames // unit_frames(model, level)
    return frames * (image_size[0] // unit[0]) * (image_size[1] // unit[1])


def check_tiles(image_size: tuple[int, int], unit: tuple[int, int], level: str) -> None:
    if image_size[0] % unit[0] or image_size[1] % unit[1]:
        raise ValueError(
            f"Image size {image_size} is not a multiple of the {level} unit size {unit}; "
            "resize the images to a multiple of it or use level='pixel'."
        )


def unit_saliency(maps: Tensor, image_size: tuple[int, int], unit: tuple[int, int]) -> Tensor:
    """Saliency per unit (B, gh, gw): maps (B, h, w) upsampled to pixels, averaged per unit."""
    grid = (image_size[0] // unit[0], image_size[1] // unit[1])
    if tuple(maps.shape[-2:]) == grid:
        return maps.float()
    pixels = F.interpolate(maps[:, None].float(), size=image_size, mode="bilinear")
    return F.avg_pool2d(pixels, unit)[:, 0]


def clip_unit_saliency(
    maps: Tensor, frames: int, span: int, image_size: tuple[int, int], unit: tuple[int, int]
) -> Tensor:
    """Saliency per unit of clips of ``frames`` T frames, (B, T / span, gh, gw): maps
    (B, F, h, w) on every frame (`frame_maps`), each frame's per unit (`unit_saliency`),
    averaged over the ``span`` frames of a unit."""
    per_frame = frame_maps(maps, frames).flatten(0, 1)  # (B * T, h, w)
    cells = unit_saliency(per_frame, image_size, unit)
    return cells.view(len(maps), frames // span, span, *cells.shape[-2:]).mean(2)


def batch_images(batch_size: int | None, x: Tensor, model: nn.Module) -> int:
    """Images per forward pass of perturbed copies of x (B, C, H, W): ``batch_size`` (>= 1),
    or for None on CUDA as many as the memory budget allows (`vizkit.hooks.passes`: at least
    the batch, at least 256 MiB, within the free memory), elsewhere as many as hold
    `BATCH_PIXELS` pixels (at least 1, at most `MAX_BATCH`: the CPU's caches, whatever the
    image size; a clip's pixels are those of all its frames)."""
    if batch_size is not None:
        return check_count("batch_size", batch_size, 1)
    if available_bytes(x.device) is not None:
        return images_per_pass(model, x, None, False, "the perturbation curves")
    pixels = x[0].numel() // x.shape[-3]  # of every frame of a clip
    return max(1, min(MAX_BATCH, BATCH_PIXELS // pixels))


@dataclass
class CurveEnds:
    """The two ends of every deletion and insertion curve of a batch, which no saliency map
    changes: the model's logits (B, K) on the images (nothing removed, or everything revealed)
    and its softmax (B, K) on each baseline (everything removed, or nothing revealed).
    `compare_saliency` computes them once for all its methods' curves."""

    logits: Tensor
    baselines: dict[str, Tensor]
    scoring: CurveScoring = field(default_factory=lambda: CurveScoring(None))

    @classmethod
    def compute(
        cls, model: nn.Module, x: Tensor, kinds: Iterable[str], batch_size: int,
        scoring: CurveScoring | None = None,
    ) -> CurveEnds:  # fmt: skip
        """The ends for images x (B, C, H, W) and the baselines ``kinds``, ``batch_size``
        images per forward pass, read by ``scoring`` (default: class logits; call under
        ``torch.no_grad``)."""
        scoring = CurveScoring(None) if scoring is None else scoring
        ends = cls(scoring.forward(model, x, batch_size), {}, scoring)
        for kind in kinds:
            ends.baseline(model, x, kind, batch_size)
        return ends

    def baseline(self, model: nn.Module, x: Tensor, kind: str, batch_size: int) -> Tensor:
        """(B, K) scored values (softmax, or a score target's (B, 1)) on the ``kind`` baseline
        of images x (computed on first use)."""
        if kind not in self.baselines:
            base = baseline_images(x, kind)
            read = self.scoring.forward(model, base, batch_size)
            self.baselines[kind] = self.scoring.values(read)
        return self.baselines[kind]

    def rows(self, rows: Tensor) -> CurveEnds:
        """The ends of the images ``rows`` (indices into the batch)."""
        return CurveEnds(
            self.logits[rows.to(self.logits.device)],
            {k: p[rows.to(p.device)] for k, p in self.baselines.items()},
            self.scoring.rows(rows),
        )


@dataclass(frozen=True)
class CurveScoring:
    """What a curve tracks on the model's output: the softmax probability of a class
    (``score`` None: class-index targets), or the value of a score target (a `vizkit.targets`
    helper or a callable on the raw output), read as one column (n, 1) so that both index
    the same way."""

    score: ScoreTarget | None

    @classmethod
    def of(cls, target: Target) -> CurveScoring:
        """The scoring ``target`` asks for."""
        return cls(target if is_score_target(target) else None)

    def read(self, output: object, rows: Tensor) -> Tensor:
        """(n, K) logits, or (n, 1) scores of the n rows of ``output`` (images ``rows``)."""
        if self.score is None:
            return model_logits(output)
        return call_target(self.score, output, rows)[:, None]

    def values(self, read: Tensor) -> Tensor:
        """(n, K) what the curve tracks of ``read``: probabilities, or the scores."""
        return read.float().softmax(-1) if self.score is None else read.float()

    def forward(self, model: nn.Module, x: Tensor, batch_size: int) -> Tensor:
        """`read` of model(x) for images x (B, C, H, W), ``batch_size`` images at a time."""
        rows = torch.arange(len(x), device=x.device)
        return torch.cat(
            [self.read(model(chunk), part) for chunk, part in zip(
                x.split(batch_size), rows.split(batch_size), strict=True)]
        )  # fmt: skip

    def rows(self, rows: Tensor) -> CurveScoring:
        """The scoring of the images ``rows`` of the batch (as a batch of their own)."""
        return self if self.score is None else CurveScoring(select_images(self.score, rows))


def perturbation_curve(
    kind: str,
    hm: HookedModel,
    x: Tensor,
    saliency: SaliencyResult | Tensor,
    target: Target,
    level: str,
    baseline: str,
    steps: int | None,
    batch_size: int | None,
    progress: bool | tqdm,
    ends: CurveEnds | None = None,
    order: str = "morf",
) -> CurveResult:
    """The ``kind`` ("deletion" or "insertion") curve for images x (B, C, H, W) and maps
    (B, h, w), or a video model's clips (B, T, C, H, W) and maps (B, F, h, w), checked first;
    ``progress``: show a bar, or an open bar to advance by the perturbed images scored
    (`compare_saliency` shares one over its methods); ``ends``: the curves' ends when known
    (`CurveEnds`), else they are computed here; ``order``: "morf"
    moves the most salient units first, "lerf" the least (kind "<kind>_lerf")."""
    x = check_images(hm.model, x)
    check_choice("baseline", baseline, BASELINES)
    check_choice("order", order, ("morf", "lerf"))
    image_size, frames = tuple(x.shape[-2:]), x.shape[1] if x.ndim == 5 else None
    batch_size = batch_images(batch_size, x, hm.model)
    unit = unit_size(hm.model, image_size, level)
    check_tiles(image_size, unit, level)
    maps = saliency_maps(saliency, len(x), image_size, frames=frames).to(x.device)
    if frames is None:
        cells = unit_saliency(maps, image_size, unit)  # (B, gh, gw)
    else:
        span = unit_frames(hm.model, level)
        cells = clip_unit_saliency(maps, frames, span, image_size, unit)  # (B, T / span, gh, gw)
        unit = (span, *unit)
    units = cells[0].numel()
    steps = curve_steps(steps, units, level)
    counts = torch.tensor([math.ceil(k * units / steps) for k in range(steps + 1)])
    with torch.no_grad(), _bar(progress, len(x) * (steps - 1), kind) as bar:
        if ends is None:
            ends = CurveEnds.compute(hm.model, x, [], batch_size, CurveScoring.of(target))
        if len(ends.logits) != len(x):
            raise ValueError(f"The curves' ends are of {len(ends.logits)} images, not {len(x)}.")
        targets = scored_classes(ends.logits, target, saliency, scores=True)
        clean = ends.scoring.values(ends.logits)
        removed = ends.baseline(hm.model, x, baseline, batch_size)
        outer = (clean, removed)  # nothing removed, everything removed
        outer = outer[::-1] if kind == "insertion" else outer
        base = baseline_images(x, baseline)
        ranked = cells if order == "morf" else -cells
        scores = _scores(
            kind, hm.model, x, base, ranked, counts, targets, batch_size, bar, outer,
            ends.scoring,
        )  # fmt: skip
    fractions = (counts.float() / units).to(x.device)
    return CurveResult(
        kind=kind if order == "morf" else f"{kind}_lerf",
        fractions=fractions,
        scores=scores,
        auc=torch.trapezoid(scores, fractions, dim=-1),
        targets=None if is_score_target(target) else targets,
        options={
            "level": level,
            "baseline": baseline,
            "steps": steps,
            "unit": unit,
            "order": order,
        },
        layout=hm.token_layout(image_size),
        image_size=image_size,
    )


@contextlib.contextmanager
def _bar(progress: bool | tqdm, total: int, desc: str) -> Iterator[tqdm]:
    """A progress bar over ``total`` perturbed images (silent for ``progress=False``), or the
    caller's open bar ``progress``."""
    if isinstance(progress, tqdm):
        yield progress
        return
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False; got {progress!r}.")
    with tqdm(total=total, desc=desc, unit="image", disable=not progress, leave=False) as bar:
        yield bar


def scored_classes(
    logits: Tensor, target: Target, saliency: SaliencyResult | Tensor, scores: bool = False
) -> Tensor:
    """(B,) the classes to score: ``target``, else the classes a `SaliencyResult` explains, else
    the argmax; with ``scores`` (a caller reading through `CurveScoring`), zeros for a score
    target (the one column it reads), which other callers are refused. A target that differs
    from the classes the maps explain is refused."""
    explained = saliency.targets if isinstance(saliency, SaliencyResult) else None
    if scores and is_score_target(target):
        if explained is not None:
            raise ValueError(
                f"The saliency maps explain classes {explained.tolist()}, and target is a score "
                "on the output: scoring maps against another target is meaningless. Compute "
                "the maps for this target, or pass target=None to score their classes."
            )
        return torch.zeros(len(logits), dtype=torch.long, device=logits.device)
    targets = target_indices(logits, explained if target is None else target)
    if explained is not None and not torch.equal(targets.cpu(), explained.cpu()):
        raise ValueError(
            f"target {targets.tolist()} differs from the classes the saliency maps explain "
            f"({explained.tolist()}); scoring maps against another class is meaningless. Pass "
            "target=None, or compute the maps for that target."
        )
    return targets


def _scores(
    kind: str,
    model: nn.Module,
    x: Tensor,
    base: Tensor,
    cells: Tensor,
    counts: Tensor,
    targets: Tensor,
    batch_size: int,
    bar: tqdm,
    outer: tuple[Tensor, Tensor],
    scoring: CurveScoring,
) -> Tensor:
    """(B, S + 1) probability of ``targets`` (B,) (or the score, by ``scoring``) with the
    first ``counts`` (S + 1,) units by ``cells`` (B, gh, gw) taken from ``base`` (deletion) or
    from ``x`` (insertion), both (B, C, H, W) (clips: ``cells`` (B, U, gh, gw) of
    (B, T, C, H, W)); ``batch_size`` perturbed images per forward, each batch a step of ``bar``.
    The first and last steps move no unit or every unit: their images are the curve's start and
    end, whose softmax (B, K) ``outer`` holds, so only the S - 1 steps between are run."""
    rank = rank_descending(cells.flatten(1))
    scores = torch.empty(len(x), len(counts), device=x.device)
    for column, probs in zip((0, -1), outer, strict=True):
        scores[:, column] = probs.to(x.device).gather(1, targets[:, None])[:, 0]
    pairs = [(b, k) for b in range(len(x)) for k in range(1, len(counts) - 1)]
    source, fill = (base, x) if kind == "insertion" else (x, base)
    images = torch.empty((min(batch_size, len(pairs)), *x.shape[1:]), dtype=x.dtype,
                         device=x.device)  # fmt: skip
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        b = torch.tensor([p[0] for p in chunk], device=x.device)
        k = torch.tensor([p[1] for p in chunk])
        chosen = rank[b] < counts[k].to(x.device)[:, None]  # (n, units) first units
        moved = _moved(images[: len(chunk)], source, fill, [p[0] for p in chunk], chosen,
                       tuple(cells.shape[1:]))  # fmt: skip
        read = scoring.read(model(moved), b)
        probs = scoring.values(read)
        scores[b, k.to(x.device)] = probs.gather(1, targets[b][:, None])[:, 0]
        bar.update(len(chunk))
    return scores


def _moved(
    out: Tensor, source: Tensor, fill: Tensor, rows: list[int], chosen: Tensor,
    grid: tuple[int, ...],
) -> Tensor:  # fmt: skip
    """``out`` (n, C, H, W) filled with image ``rows[i]`` of ``source`` whose ``chosen[i]``
    (gh * gw,) units of the ``grid`` (gh, gw) are taken from ``fill`` (both (B, C, H, W), H and
    W multiples of the grid); clips (n, T, C, H, W) by a grid (U, gh, gw), T a multiple of U.
    Written into the caller's buffer, the unit mask broadcast over each unit's pixels and each
    image over its copies: a pass allocates no image-sized tensor (the allocator's returning
    and refetching such blocks from the system slowed every forward around them by about 7 %
    on the CPU)."""
    tiles, mask_shape = _tiles(tuple(out.shape), grid)
    unit_mask = chosen.view(mask_shape)
    start = 0
    for image, copies in itertools.groupby(rows):
        stop = start + len(list(copies))
        into = out[start:stop].view(-1, *tiles)
        taken, kept = (t[image].reshape(1, *tiles) for t in (fill, source))
        torch.where(unit_mask[start:stop], taken, kept, out=into)
        start = stop
    return out


def _tiles(shape: tuple[int, ...], grid: tuple[int, ...]) -> tuple[tuple, tuple]:
    """How an (n, C, H, W) batch splits into the units of ``grid`` (gh, gw), (C, gh, rows, gw,
    cols) per image, and the shape of its (n, gh * gw) unit mask broadcast over them; an
    (n, T, C, H, W) batch of clips into those of (U, gh, gw), (U, span, C, gh, rows, gw, cols)."""
    *frames, channels, height, width = shape[1:]
    *units, gh, gw = grid
    space = (channels, gh, height // gh, gw, width // gw)
    if not frames:
        return space, (shape[0], 1, gh, 1, gw, 1)
    return (units[0], frames[0] // units[0], *space), (shape[0], units[0], 1, 1, gh, 1, gw, 1)


@analysis_contract(videos=True)
def deletion(
    model: nn.Module | HookedModel,
    x: Tensor,
    saliency: SaliencyResult | Tensor,
    target: Target = None,
    level: str = "patch",
    baseline: str = "zero",
    steps: int | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    order: str = "morf",
) -> CurveResult:
    """Deletion curve: remove the most salient units first (MoRF: lower AUC = more faithful),
    or with ``order="lerf"`` the least salient first (LeRF: higher AUC = more faithful).

    Args:
        model: any model (``torch.compile`` / ``DataParallel`` wrappers are unwrapped); run in
            eval mode, its training flags restored after.
        x: (B, C, H, W) images, B >= 1, finite; a video model's clips (B, T, C, H, W).
        saliency: a `SaliencyResult` for these images or maps (B, h, w), h and w dividing H and
            W, every value finite; for clips a video's maps (B, F, h, w), F dividing T.
        target: class scored: int, B ints or None (argmax of the clean image); or a score
            target (`vizkit.targets`, a callable on the output): the curve tracks its value.
        level: "patch" (the model's patches; CNNs: an 8 x 8 grid; a video model's patches of
            each token frame, over its tubelet's frames) or "pixel" (of one frame).
        baseline: "zero", "mean" or "blur" (see `baseline_images`).
        steps: number of removal steps, in [1, units]; None: min(16, units). Each step is a
            forward pass of every image: ``steps=64`` gives a finer AUC at 4x the cost.
        batch_size: perturbed images per forward pass, >= 1; None: as many as hold 2**19
            pixels (10 images of 224 x 224, at most 256), which bounds the activations held.
        progress: show a progress bar over the perturbed images (tqdm, notebook-aware).
        order: "morf" (most relevant first; kind "deletion") or "lerf" (least relevant
            first; kind "deletion_lerf").

    Raises:
        TypeError / ValueError: any input above out of its range; the message says which.
    """
    return perturbation_curve(
        "deletion", model, x, saliency, target, level, baseline, steps, batch_size, progress,
        order=order,
    )  # fmt: skip


@analysis_contract(videos=True)
def insertion(
    model: nn.Module | HookedModel,
    x: Tensor,
    saliency: SaliencyResult | Tensor,
    target: Target = None,
    level: str = "patch",
    baseline: str = "blur",
    steps: int | None = None,
    batch_size: int | None = None,
    progress: bool = True,
) -> CurveResult:
    """Insertion curve: reveal the most salient units first, starting from ``baseline``
    (higher AUC = more faithful). Arguments and errors as in `deletion`."""
    return perturbation_curve(
        "insertion", model, x, saliency, target, level, baseline, steps, batch_size, progress
    )


def _curve_auc(batch: ScoredBatch, kind: str, baseline: str, order: str = "morf") -> Tensor:
    """(B,) the AUC of the ``kind`` curve of the batch's maps, its ends shared."""
    return perturbation_curve(
        kind, batch.hm, batch.x, batch.result, batch.targets, batch.level, baseline,
        batch.steps, None, batch.bar, batch.ends, order,
    ).auc  # fmt: skip


@metric(
    "deletion_auc", videos=True, higher=False, short="del", curve=("deletion", "zero"), quick=True,
    summary="area under the deletion curve, most salient units first (Petsiuk et al. 2018)",
)  # fmt: skip
def _deletion_auc(batch: ScoredBatch) -> Tensor:
    return _curve_auc(batch, "deletion", "zero")


@metric(
    "deletion_lerf_auc", videos=True, higher=True, curve=("deletion", "zero"),
    summary="area under the deletion curve, least salient units first (Samek et al. 2017)",
)  # fmt: skip
def _deletion_lerf_auc(batch: ScoredBatch) -> Tensor:
    return _curve_auc(batch, "deletion", "zero", "lerf")


@metric(
    "insertion_auc", videos=True, higher=True, short="ins", curve=("insertion", "blur"), quick=True,
    summary="area under the insertion curve from a blurred image (Petsiuk et al. 2018)",
)  # fmt: skip
def _insertion_auc(batch: ScoredBatch) -> Tensor:
    return _curve_auc(batch, "insertion", "blur")
