"""Circuits: which components, connected how, carry a model's computation of a score.

The graph (`graph`): the nodes that write to the residual stream and the inputs that read it.
Attribution patching (`attribution`): each node's and edge's first-order effect of patching a
corrupted run into the clean one, EAP and EAP-IG. Exact patching (`exact`): the same effects
one run each, and how well the two agree. Circuits (`circuit`): the top edges kept and the rest
patched, and their faithfulness as they grow; ACDC (`acdc`) finds one edge by edge, exactly.
Corruptions (`corruptions`): what the clean run is compared with, and whether it changes the
score. Feature circuits' nodes (`features`): sparse autoencoder latents and error terms. A
planted-circuit ViT (`planted`) to check them against the truth.
"""

from .acdc import ACDC_METRICS, acdc
from .attribution import ATTRIBUTIONS, AttributionResult, attribution_patching
from .circuit import Circuit, FaithfulnessCurve, circuit, faithfulness
from .corruptions import CORRUPTIONS, CorruptionEffect, corrupt, corruption_effect
from .exact import Agreement, agreement, exact_patching
from .features import FeatureAttribution, feature_attribution
from .graph import ComponentGraph
from .planted import planted_circuit_vit, planted_edges, planted_images, recovery_auc

__all__ = [
    "ACDC_METRICS",
    "ATTRIBUTIONS",
    "CORRUPTIONS",
    "Agreement",
    "AttributionResult",
    "Circuit",
    "ComponentGraph",
    "CorruptionEffect",
    "FeatureAttribution",
    "FaithfulnessCurve",
    "acdc",
    "agreement",
    "attribution_patching",
    "circuit",
    "corrupt",
    "corruption_effect",
    "exact_patching",
    "faithfulness",
    "feature_attribution",
    "planted_circuit_vit",
    "planted_edges",
    "planted_images",
    "recovery_auc",
]
