"""Circuits: which components, connected how, carry a model's computation of a score.

The graph (`graph`): the nodes that write to the residual stream and the inputs that read it.
Attribution patching (`attribution`): each node's and edge's first-order effect of patching a
corrupted run into the clean one, EAP and EAP-IG. Exact patching (`exact`): the same effects
one run each, and how well the two agree.
"""

from .attribution import ATTRIBUTIONS, AttributionResult, attribution_patching
from .exact import Agreement, agreement, exact_patching
from .graph import ComponentGraph

__all__ = [
    "ATTRIBUTIONS",
    "Agreement",
    "AttributionResult",
    "ComponentGraph",
    "agreement",
    "attribution_patching",
    "exact_patching",
]
