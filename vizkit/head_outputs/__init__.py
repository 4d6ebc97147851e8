"""Each attention head's output before its block's output projection, z_h (B, N, d): read and
set per block (`readers`: at the projection's input, heads side by side; `fused`: torch's
MultiheadAttention by its weights and values), and the affine map from the heads' outputs to the
block's attention output (`ProjectionMap`). Circuits read heads as nodes through it, concepts
as units."""

from .readers import (
    HeadInputs,
    HeadReader,
    ProjectionInput,
    ProjectionMap,
    check_read,
    head_inputs,
    multihead_inputs,
    projection_maps,
)

__all__ = [
    "HeadInputs",
    "HeadReader",
    "ProjectionInput",
    "ProjectionMap",
    "check_read",
    "head_inputs",
    "multihead_inputs",
    "projection_maps",
]
