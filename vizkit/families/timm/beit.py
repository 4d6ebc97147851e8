"""BEiT (Bao et al. 2022): blocks over [class, patches]; a relative position bias of each
attention's own, or one shared across layers (``hook_pos_bias``)."""

from __future__ import annotations

import dataclasses

from timm.models import beit

from ...hooks.family import Family, register_family
from ...hooks.sites import captured
from .common import PRE_NORM, flat_layout, has_position_bias, position_bias

__all__ = ["layout"]


layout = flat_layout("beit")


FAMILY = register_family(
    Family(
        "beit",
        "timm",
        models={beit.Beit: layout},
        blocks={beit.Block: dataclasses.replace(PRE_NORM, scales=("gamma_1", "gamma_2"))},
        attention={
            beit.Attention: captured("self", position=position_bias, has_position=has_position_bias)
        },
    )
)
