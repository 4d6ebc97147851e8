"""Names checked on images they were not chosen on: for each unit named after a concept by
`dissect` or `clip_dissect`, how well its largest activation over an image tells the new images
that hold the concept from those that do not (ROC AUC, 0.5: chance, 1: every image of the
concept above every other), beside the score the name was chosen by; one table sortable by
either.

A unit's score of image x is the largest of its map over x's patch tokens (what
`vizkit.sae.Features.class_detectors` ranks). The AUC is the Mann-Whitney statistic with ties
averaged: (R - p (p + 1) / 2) / (p n), R the rank sum of the p images of the concept among all
p + n (Hanley and McNeil 1982)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from scipy.stats import rankdata
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.result import Result
from ..hooks import HookedModel
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count
from ..sae.autoencoder import SparseAutoencoder
from ..store import ActivationStore
from .clip_dissect import CLIPDissection
from .dissection import Concepts, Dissection
from .probe_set import ProbeSet, probe_set
from .units import Heads, Units, read_units

__all__ = ["NamedUnits", "check_names", "concept_presence", "image_auc", "image_maxima"]

SCORES = {Dissection: ("IoU", "best_iou"), CLIPDissection: ("similarity", "best")}
SORTS = ("score", "held_out_auc")


@dataclass(repr=False)
class NamedUnits(Result):
    """Each unit's name, the score it was chosen by and its AUC on held-out images.

    Attributes:
        units: the U units' names.
        names: each unit's name (a concept).
        scores: (U,) the score the name was chosen by (``score``: "IoU" or "similarity").
        held_out_auc: (U,) the AUC of the unit's per-image maximum for its concept over the
            held-out images; NaN where none or all of them hold the concept.
        positives: (U,) how many held-out images hold each unit's concept.
    """

    units: list[str]
    names: list[str]
    scores: Tensor
    held_out_auc: Tensor
    positives: Tensor
    score: str = "score"
    options: dict = field(default_factory=dict)

    def table(self, by: str = "score", k: int | None = None) -> list[tuple[str, str, float, float]]:
        """(unit, name, score, held-out AUC) of the ``k`` units highest by ``by`` ("score"
        or "held_out_auc"; all: None), highest first, NaN last."""
        if by not in SORTS:
            raise ValueError(f"by must be one of {SORTS}; got {by!r}.")
        values = self.scores if by == "score" else self.held_out_auc
        order = values.nan_to_num(-torch.inf).argsort(descending=True, stable=True)
        if k is not None:
            order = order[: check_count("k", k)]
        return [(self.units[i], self.names[i], float(self.scores[i]),
                 float(self.held_out_auc[i])) for i in order.tolist()]  # fmt: skip

    def markdown(self, by: str = "score", k: int | None = 20) -> str:
        """The `table` as a Markdown table."""
        rows = [f"| unit | name | {self.score} | held-out AUC |", "|---|---|---:|---:|"]
        rows += [f"| {unit} | {name} | {score:.3f} | {auc:.3f} |"
                 for unit, name, score, auc in self.table(by, k)]  # fmt: skip
        return "\n".join(rows)

    def confirmed(self, auc: float = 0.75) -> Tensor:
        """(U,) bool: the units whose held-out AUC for their name is at least ``auc``."""
        return self.held_out_auc.nan_to_num(0.0) >= auc


def image_auc(values: Tensor, present: Tensor) -> Tensor:
    """(K, U) ROC AUC of each unit's per-image values ``values`` (N, U) for each concept of
    ``present`` (N, K) bool, ties averaged; NaN for a concept in none or all of the images."""
    ranks = torch.from_numpy(rankdata(values.double().numpy(), axis=0))  # (N, U)
    positive = present.double()
    p = positive.sum(0)[:, None]  # (K, 1)
    n = len(values) - p
    auc = (positive.T @ ranks - p * (p + 1) / 2) / (p * n)
    return torch.where((p > 0) & (n > 0), auc, torch.nan)


def image_maxima(units: Units, probes: ProbeSet, progress: bool = False) -> Tensor:
    """(N, U) each unit's largest value over the patches of each image of ``probes``."""
    maxima = [units.read(x, rows).flatten(2).amax(2).cpu()
              for x, _, rows in tqdm(probes.batches(), desc="image maxima",
                                     disable=not progress, leave=False)]  # fmt: skip
    return torch.cat(maxima)


@analysis_contract
def check_names(
    model: nn.Module | HookedModel,
    named: Dissection | CLIPDissection,
    images: object,
    present: Concepts | Tensor,
    units: str | SparseAutoencoder | None = None,
    batch_size: int = 64,
    progress: bool = True,
    store: ActivationStore | None = None,
) -> NamedUnits:
    """Each unit's name from ``named`` checked on held-out ``images``.

    Args:
        named: a `Dissection` or `CLIPDissection` of ``model``'s units.
        images: held-out images (N, C, H, W) normalized for the model, or a Dataset or a
            non-shuffling DataLoader of them; None with ``store``.
        present: which images hold which concept of ``named.concepts``: `Concepts` of the
            same names (an image holds a concept where its mask has a pixel), or (N, K) bool in
            the order of ``named.concepts``.
        units: the SparseAutoencoder ``named`` dissected; None for channels (read at
            ``named.options["layer"]``).
        store: an `vizkit.ActivationStore` of the held-out images to read the units from.

    Returns:
        `NamedUnits`.
    """
    score, attribute = _score_of(named)
    batch_size = check_count("batch_size", batch_size)
    units = _units_of(named, units)
    present = concept_presence(present, named.concepts)
    probes = probe_set(images, batch_size, "check_names", store)
    if probes.count is not None and probes.count != len(present):
        raise ValueError(
            f"The held-out set holds {probes.count} images but present says which concepts "
            f"{len(present)} images hold; give one row per image."
        )
    first = None if store is not None else next(probes.batches())[0][:1]
    image_size = named.image_size if first is None else tuple(first.shape[-2:])
    found = read_units(model, units, tuple(image_size), first, store)
    if found.names != named.units:
        raise ValueError(
            f"These units ({found.names[0]} ... {len(found.names)}) are not the ones named "
            f"({named.units[0]} ... {len(named.units)}); pass the units that were named."
        )
    values = image_maxima(found, probes, progress)  # (N, U)
    if len(values) != len(present):
        raise ValueError(f"The held-out set held {len(values)} images, not {len(present)}.")
    concept = torch.tensor([named.concepts.index(name) for name in named.labels])
    auc = image_auc(values, present)[concept, torch.arange(len(concept))]
    return NamedUnits(
        list(named.units), list(named.labels), getattr(named, attribute).float(), auc.float(),
        present.sum(0)[concept], score,
        options={"layer": found.layer, "units": found.source, "images": len(values),
                 "store": None if store is None else str(store.folder)},
    )  # fmt: skip


def _score_of(named: object) -> tuple[str, str]:
    for kind, found in SCORES.items():
        if isinstance(named, kind):
            return found
    raise TypeError(
        f"named must be a Dissection or a CLIPDissection (vk.concepts.dissect, clip_dissect); "
        f"got {type(named).__name__}."
    )


def _units_of(named: Dissection | CLIPDissection, units: object) -> str | SparseAutoencoder | Heads:
    """The units ``named`` measured: its layer's channels, its block's heads, or the
    autoencoder passed."""
    source = named.options.get("units")
    if source == "sae" and not isinstance(units, SparseAutoencoder):
        raise ValueError(
            "These names are of an autoencoder's latents; pass it: units=<the "
            "SparseAutoencoder dissected>."
        )
    if source == "channels" and units is not None and units != named.options["layer"]:
        raise ValueError(
            f"These names are of the channels of {named.options['layer']}; got units={units!r}."
        )
    if source == "heads":
        return Heads(named.options["layer"].removesuffix(".hook_attn_out"))
    return named.options["layer"] if source == "channels" else units


def concept_presence(present: object, concepts: list[str]) -> Tensor:
    """(N, K) bool: which images hold which of ``concepts``."""
    if isinstance(present, Concepts):
        missing = [name for name in concepts if name not in present.names]
        if missing:
            raise ValueError(
                f"The held-out concepts lack {missing}; give masks of every concept named "
                f"({concepts})."
            )
        order = [present.names.index(name) for name in concepts]
        return present.masks[:, order].flatten(2).any(2)
    if not isinstance(present, Tensor) or present.dtype != torch.bool or present.ndim != 2:
        raise TypeError(
            "present must be Concepts or an (N, K) bool tensor of which images hold which "
            f"concept; got {getattr(present, 'shape', type(present).__name__)}."
        )
    if present.shape[1] != len(concepts):
        raise ValueError(
            f"present has {present.shape[1]} columns but {len(concepts)} concepts were named; "
            "give one column per concept, in the order of named.concepts."
        )
    return present.cpu()
