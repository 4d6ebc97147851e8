"""The names a naming result gives units, as short labels for explorers: unit index ->
"name (score)". Network Dissection names only its detectors (a label under the IoU threshold
names nothing); CLIP-Dissect every unit; a held-out check every unit, with its AUC; probes each
class's unit. `head_names` gathers the names of heads (`Heads`) of one or more blocks for the
head and circuit explorers, keyed by the circuits' node names ("blocks.3 head 2")."""

from __future__ import annotations

from .clip_dissect import CLIPDissection
from .dissection import Dissection
from .held_out import NamedUnits
from .probes import Probes

__all__ = ["head_names", "unit_names"]


def unit_names(named: Dissection | CLIPDissection | NamedUnits | Probes) -> dict[int, str]:
    """unit index -> "name (score)" of the units ``named`` names."""
    if isinstance(named, Dissection):
        return {i: f"{named.labels[i]} (IoU {float(named.best_iou[i]):.2f})"
                for i in named.detectors.nonzero().flatten().tolist()}  # fmt: skip
    if isinstance(named, CLIPDissection):
        kind = named.options.get("similarity", "similarity")
        return {i: f"{label} ({kind} {float(named.best[i]):.2f})"
                for i, label in enumerate(named.labels)}  # fmt: skip
    if isinstance(named, NamedUnits):
        return {i: f"{label} ({named.score} {float(named.scores[i]):.2f}, held-out AUC "
                   f"{float(named.held_out_auc[i]):.2f})"
                for i, label in enumerate(named.names)}  # fmt: skip
    if isinstance(named, Probes):
        found: dict[int, list[str]] = {}
        for c, unit in enumerate(named.best.tolist()):
            found.setdefault(unit, []).append(f"{named.classes[c]} (AP {float(named.ap[c]):.2f})")
        return {unit: ", ".join(names) for unit, names in found.items()}
    raise TypeError(
        "names must be a Dissection, CLIPDissection, NamedUnits or Probes (vk.concepts); got "
        f"{type(named).__name__}."
    )


def head_names(named: object) -> dict[str, str]:
    """ "<block> head <h>" -> "name (score)" of the heads one naming result of `Heads`, or a
    list of them (one per block), names.

    Raises:
        ValueError: a result of other units than heads."""
    results = list(named) if isinstance(named, (list, tuple)) else [named]
    found: dict[str, str] = {}
    for result in results:
        units = getattr(result, "options", {}).get("units")
        if units != "heads":
            raise ValueError(
                f"These names are of {units or type(result).__name__}, not of heads: name a "
                "block's heads with units=vk.concepts.Heads(block) (e.g. vk.concepts.dissect("
                "model, images, concepts, vk.concepts.Heads('blocks.3')))."
            )
        found.update({result.units[i]: label for i, label in unit_names(result).items()})
    return found


def checked_head_names(named: object, blocks: list[str], what: str) -> dict[str, str]:
    """`head_names` of ``named`` (None: none), keyed by ``blocks``' names (those ``what``
    shows; a block named inside a wrapper, "model.<block>", is the same block), refused where
    a name is of a block outside them."""
    if named is None:
        return {}
    found, outside = {}, set()
    for unit, label in head_names(named).items():
        block, head = unit.rsplit(" head ", 1)
        same = [b for b in blocks if b == block or b.endswith(f".{block}") or
                block.endswith(f".{b}")]  # fmt: skip
        if len(same) != 1:
            outside.add(block)
            continue
        found[f"{same[0]} head {head}"] = label
    if outside:
        raise ValueError(
            f"These names are of heads of {sorted(outside)}, which {what} does not show (its "
            f"blocks: {blocks}); name heads of those blocks."
        )
    return found
