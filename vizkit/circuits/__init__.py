"""Circuits: which components, connected how, carry a model's computation of a score.

The graph (`graph`): the nodes that write to the residual stream and the inputs that read it.
Attribution patching (`attribution`): each node's and edge's first-order effect of patching a
corrupted run into the clean one, EAP and EAP-IG. Exact patching (`exact`): the same effects
one run each, and how well the two agree. Circuits (`circuit`): the top edges kept and the rest
patched, and their faithfulness as they grow; ACDC (`acdc`) finds one edge by edge, exactly.
Corruptions (`corruptions`): what the clean run is compared with, and whether it changes the
score. Feature circuits: sparse autoencoder latents and error terms as nodes (`features`), the
edges between consecutive autoencoders' nodes (`feature_edges`), their exact patching
(`feature_patching`), and a circuit of latents with its faithfulness (`feature_circuit`). A
planted-circuit ViT (`planted`) to check them against the truth.
"""

from .acdc import ACDC_METRICS, acdc
from .attribution import ATTRIBUTIONS, AttributionResult, attribution_patching
from .circuit import Circuit, FaithfulnessCurve, circuit, faithfulness
from .corruptions import CORRUPTIONS, CorruptionEffect, corrupt, corruption_effect
from .exact import Agreement, agreement, exact_patching
from .feature_circuit import FeatureCircuit, feature_circuit, feature_faithfulness
from .feature_edges import FeatureEdges, feature_edges
from .feature_patching import exact_feature_patching, feature_agreement
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
    "FeatureCircuit",
    "FeatureEdges",
    "FaithfulnessCurve",
    "acdc",
    "agreement",
    "attribution_patching",
    "circuit",
    "corrupt",
    "corruption_effect",
    "exact_feature_patching",
    "exact_patching",
    "faithfulness",
    "feature_agreement",
    "feature_attribution",
    "feature_circuit",
    "feature_edges",
    "feature_faithfulness",
    "planted_circuit_vit",
    "planted_edges",
    "planted_images",
    "recovery_auc",
]
