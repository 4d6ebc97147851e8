"""A run's activations at the component graph's points: the stream entering each block, each
attention and MLP output, and each head's output before the projection (z)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from ..head_outputs import HeadInputs, check_read
from ..hooks import HookedModel

__all__ = ["Points", "point_names", "read_heads", "read_points"]


@dataclass
class Points:
    """A run's activations at the graph's points, each (B, N, C) (z: (B, N, H d)), per block."""

    resid: list[Tensor]
    attn: list[Tensor]
    mlp: list[Tensor]
    z: list[Tensor] | None

    def minus(self, other: Points) -> Points:
        def sub(a, b):
            return None if a is None else [x - y for x, y in zip(a, b, strict=True)]

        return Points(*(sub(getattr(self, k), getattr(other, k)) for k in vars(self)))


def point_names(blocks: list[str]) -> dict[str, list[str]]:
    """The hooks of each kind of point, per block ("mid": the stream entering the MLP)."""
    return {
        "resid": [f"{b}.hook_resid_pre" for b in blocks],
        "mid": [f"{b}.hook_resid_mid" for b in blocks],
        "attn": [f"{b}.hook_attn_out" for b in blocks],
        "mlp": [f"{b}.hook_mlp_out" for b in blocks],
    }


def read_points(
    hm: HookedModel, x: Tensor, blocks: list[str], found: HeadInputs | None
) -> tuple[Points, object]:
    """The activations of one run on x without gradients, and the model's output."""
    names = point_names(blocks)
    wanted = [*names["resid"], *names["attn"], *names["mlp"]]
    z: list[Tensor] = []
    reading = nullcontext() if found is None else found.reading(lambda t: z.append(t.clone()))
    with reading, torch.no_grad():
        output, cache = hm.run_with_cache(x, wanted)
    if found is not None:
        check_read(z, found)
    shapes = {tuple(cache[n].shape) for n in wanted}
    if len(shapes) != 1:
        raise ValueError(
            f"The blocks' streams differ in shape ({sorted(shapes)[:3]}): the model changes its "
            "tokens or width between blocks (patch merging, a class-attention stage), so its "
            "stream is not one sum of the blocks' outputs, which the component graph needs."
        )
    kinds = ("resid", "attn", "mlp")
    points = Points(*([cache[n] for n in names[k]] for k in kinds), z if found else None)
    return points, output


def read_heads(hm: HookedModel, x: Tensor, found: HeadInputs) -> list[Tensor]:
    """The heads' outputs z (B, N, H d) of each of ``found``'s blocks in one run on x."""
    z: list[Tensor] = []
    with found.reading(lambda t: z.append(t.clone())), torch.no_grad():
        hm.model(x)
    check_read(z, found)
    return z
