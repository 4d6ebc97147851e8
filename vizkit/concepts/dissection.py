"""Network Dissection (Bau, Zhou, Khosla, Oliva and Torralba 2017, "Network Dissection:
Quantifying Interpretability of Deep Visual Representations", Sec. 2.2-2.3) of a ViT's units:
the channels of a token stream, or the latents of a sparse autoencoder on one.

Unit k's map A_k(x) is its activation at each patch token of image x. Its threshold T_k is
the top ``quantile`` of A_k over every spatial location of every probe image's map,
P(a_k > T_k) = quantile, as the paper sets it (Sec. 2.2: "over every spatial location of the
activation map in the data set"; NetDissect-Lite's ``quantile_threshold`` reads the feature maps
too). Each map is then upsampled bilinearly to the image's size, S_k(x); the unit's mask is
M_k(x) = S_k(x) > T_k, and its IoU with concept c of masks L_c(x) is
sum_x |M_k(x) & L_c(x)| / sum_x |M_k(x) | L_c(x)| (Eq. 1). A unit is labelled with its concept of
highest IoU, and detects it where that IoU > 0.04.

Two passes over the probe set. The first keeps, per unit, the largest values of its maps,
merged batch by batch with ``torch.topk``: the top quantile is read from them exactly as
``torch.quantile`` reads it from all of them, and they are quantile x images x patches + 2
values per unit (4,096 latents over 2,000 images of 196 patches: 32 MB), however large the
batches. The second counts, per unit and concept, the pixels of the masks' intersections and
the masks' areas, upsampling only the maps that exceed their threshold somewhere (an upsampled
value lies between the map's: a sparse latent is upsampled on the few images it fires on), an
image's maps a chunk of units at a time, each chunk at most `CHUNK_BYTES`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.result import Result
from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import DEFAULT_MAX_BYTES, check_count, check_number
from ..sae.autoencoder import SparseAutoencoder
from ..store import ActivationStore
from .probe_set import ProbeSet, probe_set
from .units import Units, read_units

__all__ = ["CHUNK_BYTES", "Concepts", "Dissection", "dissect"]

CHUNK_BYTES = 256 * 2**20  # the most one chunk of upsampled unit maps holds


@dataclass
class Concepts:
    """Binary concept masks aligned with a probe set of images.

    Attributes:
        names: the K concepts' names.
        masks: (B, K, H, W) bool, concept k's pixels in image b.
    """

    names: list[str]
    masks: Tensor

    def __post_init__(self) -> None:
        names, masks = self.names, self.masks
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"Concept names must be a list of strings; got {names!r}.")
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"Concept names must be one or more distinct names; got {names}.")
        if not isinstance(masks, Tensor) or masks.dtype != torch.bool:
            got = masks.dtype if isinstance(masks, Tensor) else type(masks).__name__
            raise TypeError(f"Concept masks must be a bool tensor (B, K, H, W); got {got}.")
        if masks.ndim != 4 or masks.shape[1] != len(names) or len(masks) == 0:
            raise ValueError(
                f"Concept masks must be (B, K, H, W) with B >= 1 and K = {len(names)} (one per "
                f"name); got shape {tuple(masks.shape)}."
            )
        self.names = list(names)


@dataclass(repr=False)
class Dissection(Result):
    """Each unit's IoU with each concept (Bau et al. 2017, Eq. 1), its label and whether it is
    a detector.

    Attributes:
        units: the U units' names ("<hook name> <channel>" or "latent <i>").
        concepts: the K concepts' names.
        iou: (U, K) IoU of each unit's thresholded masks with each concept's masks.
        thresholds: (U,) each unit's activation threshold T_k.
        labels: each unit's concept of highest IoU (the first of equals).
        best_iou: (U,) that IoU.
        detectors: (U,) bool, best IoU above ``options["threshold"]``.
    """

    units: list[str]
    concepts: list[str]
    iou: Tensor
    thresholds: Tensor
    labels: list[str]
    best_iou: Tensor
    detectors: Tensor
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def table(self, k: int | None = None) -> list[tuple[str, str, float]]:
        """(unit, label, IoU) of the ``k`` units of highest IoU (all: None), highest first."""
        order = self.best_iou.argsort(descending=True, stable=True)
        if k is not None:
            order = order[: check_count("k", k)]
        return [(self.units[i], self.labels[i], float(self.best_iou[i])) for i in order.tolist()]

    def detector_counts(self) -> dict[str, int]:
        """How many units detect each concept (are detectors labelled with it)."""
        counts = dict.fromkeys(self.concepts, 0)
        for label, detector in zip(self.labels, self.detectors.tolist(), strict=True):
            counts[label] += detector
        return counts


@analysis_contract
def dissect(
    model: nn.Module | HookedModel,
    images: object,
    concepts: Concepts,
    units: str | SparseAutoencoder,
    quantile: float = 0.005,
    threshold: float = 0.04,
    batch_size: int = 64,
    progress: bool = True,
    store: ActivationStore | None = None,
) -> Dissection:
    """Network Dissection of ``units`` of ``model`` against ``concepts`` on ``images``.

    Args:
        images: (B, C, H, W) normalized for the model, or a Dataset or a DataLoader (not
            shuffling) of images or (image, ...) tuples, in the order of ``concepts``.
        concepts: `Concepts`, one mask per image and concept, of the images' size.
        units: a hook name whose activation is a token stream (B, N, C), each channel a unit
            (e.g. "blocks.2.mlp.act.hook_out", "blocks.2.hook_resid_post"); or a
            `vizkit.sae.SparseAutoencoder` trained on this model, each latent a unit.
        quantile: the share of each unit's pixels above its threshold, in (0, 1).
        threshold: the IoU above which a unit detects its label.
        batch_size: images per forward.
        progress: progress bars over the two passes.
        store: an `vizkit.ActivationStore` of this model holding every patch token of the
            units' layer over the probe set: the maps are read from its rows instead of
            running the model (``images`` None, or the images it was written from).

    Returns:
        `Dissection`. A unit's map is its activation at each patch token, upsampled bilinearly
        to the image's size.
    """
    quantile = check_number("quantile", quantile, 0, 1, low_open=True, high_open=True)
    threshold = check_number("threshold", threshold, 0, 1)
    batch_size = check_count("batch_size", batch_size)
    if not isinstance(concepts, Concepts):
        raise TypeError(
            f"concepts must be a Concepts (names, masks); got {type(concepts).__name__}."
        )
    probes = probe_set(images, batch_size, "dissect", store)
    masks, image_size = concepts.masks, tuple(concepts.masks.shape[-2:])
    if probes.count is not None and probes.count != len(masks):
        raise ValueError(
            f"The probe set holds {probes.count} images but the concepts hold masks of "
            f"{len(masks)}; give one mask per image and concept, in the images' order."
        )
    first = None if store is not None else next(_aligned(probes, masks, image_size))[0][:1]
    found = read_units(model, units, image_size, first, store)
    batches = None if probes.count is None else -(-probes.count // batch_size)
    bars = {"disable": not progress, "unit": "batch", "leave": False, "total": batches}
    thresholds = _thresholds(found, probes, masks, quantile, bars)
    iou = _iou(found, probes, masks, thresholds, bars)
    best_iou, best = iou.max(1)
    return Dissection(
        found.names, concepts.names, iou, thresholds, [concepts.names[i] for i in best.tolist()],
        best_iou, best_iou > threshold,
        options={"quantile": quantile, "threshold": threshold, "units": found.source,
                 "layer": found.layer, "store": None if store is None else str(store.folder)},
        layout=model.token_layout(image_size, found.layer), image_size=image_size,
    )  # fmt: skip


def _aligned(
    probes: ProbeSet, masks: Tensor, image_size: tuple[int, int]
) -> Iterator[tuple[Tensor | None, range, Tensor]]:
    """Each batch's images (B, C, H, W) (None from a store), their indices and their concept
    masks (B, K, H, W); refuses images of another size than the masks' and a probe set of
    another count."""
    rows = range(0)
    for x, _, rows in probes.batches():
        if x is not None and tuple(x.shape[-2:]) != image_size:
            raise ValueError(
                f"The images are {tuple(x.shape[-2:])} but the concept masks "
                f"{image_size}; give masks of the images' size."
            )
        if rows.stop > len(masks):
            raise ValueError(f"The probe set holds more images than the {len(masks)} masks.")
        yield x, rows, masks[rows.start : rows.stop]
    if rows.stop != len(masks):
        raise ValueError(f"The probe set holds {rows.stop} images but the concepts {len(masks)}.")


def _fired(
    maps: Tensor, thresholds: Tensor, size: tuple[int, int]
) -> Iterator[tuple[int, Tensor, Tensor]]:
    """Each unit's mask on each image where it can fire: (image, the units (U_b,), their maps
    upsampled bilinearly to ``size`` (Bau et al. 2017, Sec. 2.2) and cut at their thresholds,
    (U_b, H W) float), at most `CHUNK_BYTES` of maps at a time. An upsampled value is a convex
    combination of the map's, so a unit whose map on an image stays at or below its threshold
    fires nowhere there and is skipped (a sparse latent on most images)."""
    above = maps.flatten(2).amax(2) > thresholds  # (B, U)
    step = max(1, CHUNK_BYTES // (4 * size[0] * size[1]))
    for b, active in enumerate(above):
        units = active.nonzero().flatten()
        for start in range(0, len(units), step):
            chunk = units[start : start + step]
            up = F.interpolate(maps[b, chunk][None], size=size, mode="bilinear",
                               align_corners=False)[0]  # fmt: skip
            yield b, chunk, (up > thresholds[chunk, None, None]).flatten(1).float()


def _thresholds(
    units: Units, probes: ProbeSet, masks: Tensor, quantile: float, bars: dict
) -> Tensor:
    """(U,) each unit's top ``quantile`` over every patch of every probe image's map, read as
    ``torch.quantile(values, 1 - quantile)`` reads it (linear interpolation) from the values
    from its lower rank up, kept by ``torch.topk`` batch by batch."""
    top, kept, rank, below = None, 0, 0.0, 0
    image_size = tuple(masks.shape[-2:])
    for x, rows, _ in tqdm(_aligned(probes, masks, image_size), desc="dissect: thresholds",
                           **bars):  # fmt: skip
        maps = units.read(x, rows).to(units.device)  # (B, U, gh, gw)
        if top is None:
            total = len(masks) * maps.shape[2] * maps.shape[3]
            rank = (1 - quantile) * (total - 1)  # ascending rank of the threshold
            below = math.floor(rank)
            kept = total - below  # the values of ascending rank >= below
            _check_held(len(units.names), kept, quantile, total)
            top = maps.new_empty(len(units.names), 0)
        merged = torch.cat([top, maps.transpose(0, 1).flatten(1)], 1)
        top = merged.topk(min(kept, merged.shape[1]), dim=1).values
    low = top[:, kept - 1]  # descending: ascending rank ``below``
    high = top[:, max(kept - 2, 0)]  # ascending rank ``below + 1`` (the last: itself)
    return torch.lerp(low, high, rank - below).cpu()


def _check_held(units: int, kept: int, quantile: float, total: int) -> None:
    """Refuses a top quantile of more than `DEFAULT_MAX_BYTES` over all units."""
    held = units * kept * 4
    if held > DEFAULT_MAX_BYTES:
        raise ValueError(
            f"The top {quantile} of {units} units over {total} patches are "
            f"{held / 2**30:.1f} GiB; dissect fewer images or a smaller quantile."
        )


def _iou(units: Units, probes: ProbeSet, masks: Tensor, thresholds: Tensor, bars: dict) -> Tensor:
    """(U, K) each unit's IoU with each concept: pixels of the intersections of its masks
    (upsampled map > threshold) with the concept's over the probe set, over those of their
    unions (0 where both are empty)."""
    device = units.device
    count, concepts = len(units.names), masks.shape[1]
    inter = torch.zeros(count, concepts, dtype=torch.float64)
    unit_area = torch.zeros(count, dtype=torch.float64)
    concept_area = torch.zeros(concepts, dtype=torch.float64)
    image_size = tuple(masks.shape[-2:])
    cut = thresholds.to(device)
    for x, rows, truth in tqdm(_aligned(probes, masks, image_size), desc="dissect: IoU",
                               **bars):  # fmt: skip
        truth = truth.to(device).flatten(2).float()  # (B, K, HW)
        concept_area += truth.sum(2).cpu().double().sum(0)
        maps = units.read(x, rows).to(device)  # (B, U, gh, gw)
        for b, chunk, fired in _fired(maps, cut, image_size):
            # each count is at most H W: exact in float32; summed on the host in float64
            inter.index_add_(0, chunk.cpu(), (fired @ truth[b].T).cpu().double())
            unit_area.index_add_(0, chunk.cpu(), fired.sum(1).cpu().double())
    union = unit_area[:, None] + concept_area[None] - inter
    return torch.where(union > 0, inter / union.clamp_min(1), 0.0).float()
