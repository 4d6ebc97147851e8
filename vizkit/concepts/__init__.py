"""Concepts: what a model's units detect, what to call them, and how a prediction uses them.

Network Dissection (`dissection`): each unit's thresholded activation maps against binary
concept masks, their IoU, the unit's label and whether it detects it. CLIP-Dissect
(`clip_dissect`): each unit named after the concept text whose CLIP similarities over a probe
set follow its activations. Names checked on held-out images (`held_out`): each unit's AUC for
its name beside the score it was chosen by. saev's 1-D probes (`probes`): a logistic probe per
unit and class on patch labels, Probe R, AP and purity. Concept-conditional maps
(`conditioned`): the relevance of a prediction through one unit, as concept relevance
propagation conditions it. TCAV (`tcav`): concept activation vectors and the share of
images a concept pushes toward a target, tested against random concepts. CRAFT (`craft`): a
class's concepts by non-negative factorization of crops' activations, their Sobol importance
and maps. Short labels of the names for explorers (`naming`). The units (`units`: a
stream's channels, an autoencoder's latents, a block's heads) are read by running the model or
from an activation store; the probe images (`probe_set`) come as tensors, data sets or a store.
The Shapes probe set (`shapes_concepts`): its images with a mask per shape class, object,
background and tone.
"""

from .clip_dissect import CLIPDissection, clip_dissect
from .conditioned import CONDITIONED_METHODS, ConditionedMaps, conditioned_maps
from .craft import Craft, concept_maps, craft, perturbed_logits
from .dissection import CHUNK_BYTES, Concepts, Dissection, dissect
from .held_out import NamedUnits, check_names, concept_presence, image_auc, image_maxima
from .naming import head_names, unit_names
from .probes import PURITY_K, PatchLabels, Probes, patch_labels, probe_units
from .shapes_concepts import (
    SHAPES_CONCEPTS,
    background_contrast,
    shapes_concepts,
    striped_scenes,
    truth_units,
)
from .tcav import CAV, TCAVResult, concept_activation_vector, concept_sensitivity, tcav
from .units import Heads

__all__ = [
    "CAV", "CHUNK_BYTES", "CLIPDissection", "CONDITIONED_METHODS", "Concepts", "ConditionedMaps",
    "Craft", "Dissection", "Heads", "NamedUnits", "PURITY_K", "PatchLabels", "Probes",
    "SHAPES_CONCEPTS", "TCAVResult", "background_contrast", "check_names", "clip_dissect",
    "concept_activation_vector", "concept_maps", "concept_presence", "concept_sensitivity",
    "conditioned_maps", "craft", "dissect", "head_names", "image_auc", "image_maxima",
    "patch_labels", "perturbed_logits", "probe_units", "shapes_concepts", "striped_scenes", "tcav",
    "truth_units", "unit_names",
]  # fmt: skip
