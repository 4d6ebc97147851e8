"""Concepts: what a model's units detect, measured against concept masks or named by a CLIP
model.

Network Dissection (`dissection`): each unit's thresholded activation maps against binary
concept masks, their IoU, the unit's label and whether it detects it. CLIP-Dissect
(`clip_dissect`): each unit named after the concept text whose CLIP similarities over a probe
set follow its activations. The Shapes probe set (`shapes_concepts`): its images with a mask
per shape class, object, background and tone.
"""

from .clip_dissect import CLIPDissection, clip_dissect
from .dissection import CHUNK_BYTES, Concepts, Dissection, dissect
from .shapes_concepts import SHAPES_CONCEPTS, shapes_concepts

__all__ = [
    "CHUNK_BYTES", "SHAPES_CONCEPTS", "CLIPDissection", "Concepts", "Dissection", "clip_dissect",
    "dissect", "shapes_concepts",
]  # fmt: skip
