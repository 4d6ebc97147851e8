"""timm's CaiT family beside the paper's Table 3: parameters and FLOPs, counted on the meta
device (no weights are allocated)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

from ...analysis.result import Result

__all__ = ["PAPER_TABLE3", "CaitFamilyRow", "cait_family_table"]

# Table 3 (and Table 5 for M-48): params (M) and FLOPs (B, multiply-accumulates) at the
# resolution of the timm model
PAPER_TABLE3 = {
    "cait_xxs24_224": (12.0, 2.5),
    "cait_xxs24_384": (12.0, 9.5),
    "cait_xxs36_224": (17.3, 3.8),
    "cait_xxs36_384": (17.3, 14.2),
    "cait_xs24_384": (26.6, 19.3),
    "cait_s24_224": (46.9, 9.4),
    "cait_s24_384": (46.9, 32.2),
    "cait_s36_384": (68.2, 48.0),
    "cait_m36_384": (270.9, 173.3),
    "cait_m48_448": (356.0, 329.6),
}


@dataclass(repr=False)
class CaitFamilyRow(Result):
    """One model: measured and paper values; params in millions, FLOPs in billions of MACs.

    Table 3 counts parameters at 224 px (the position embedding grows with the resolution), so
    ``params_224`` is what compares with ``paper_params``; ``params`` is at ``resolution``.
    """

    name: str
    resolution: int
    params: float
    params_224: float
    paper_params: float
    flops: float
    paper_flops: float

    def rows(self) -> list[dict]:
        return [{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}]

    @property
    def params_diff(self) -> float:
        return self.params_224 - self.paper_params

    @property
    def flops_diff_percent(self) -> float:
        return 100 * (self.flops - self.paper_flops) / self.paper_flops


def cait_family_table(names: list[str] | None = None) -> list[CaitFamilyRow]:
    """Every timm ``cait_*`` model (or ``names``) built on the meta device: parameter count and
    forward FLOPs at its native resolution (torch's FlopCounterMode counts 2 per multiply-add;
    halved here to the paper's MACs) beside Table 3.

    The hard-coded paper values quote Table 3; the measurements are computed."""
    rows = []
    for name in names or sorted(timm.list_models("cait_*")):
        if name not in PAPER_TABLE3:
            raise KeyError(f"{name!r} has no Table 3 row; known: {sorted(PAPER_TABLE3)}.")
        with torch.device("meta"):
            model = timm.create_model(name).eval()
            size = model.pretrained_cfg["input_size"][-1]
            x = torch.empty(1, 3, size, size)
            counter = FlopCounterMode(display=False)
            with counter:  # (no_grad trips its module tracker on the expanded cls_token)
                model(x)
            at_224 = timm.create_model(name, img_size=224)
        paper_params, paper_flops = PAPER_TABLE3[name]
        flops = counter.get_total_flops() / 2e9
        row = (name, size, _millions(model), _millions(at_224), paper_params, flops, paper_flops)
        rows.append(CaitFamilyRow(*row))
    return rows


def _millions(model: torch.nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6
