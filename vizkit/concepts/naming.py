"""The names a naming result gives units, as short labels for explorers: unit index ->
"name (score)". Network Dissection names only its detectors (a label under the IoU threshold
names nothing); CLIP-Dissect every unit; a held-out check every unit, with its AUC; probes each
class's unit."""

from __future__ import annotations

from .clip_dissect import CLIPDissection
from .dissection import Dissection
from .held_out import NamedUnits
from .probes import Probes

__all__ = ["unit_names"]


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
