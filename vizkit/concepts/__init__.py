"""Concepts: what a model's units detect, measured against concept masks.

Network Dissection (`dissection`): each unit's thresholded activation maps against binary
concept masks, their IoU, the unit's label and whether it detects it. The Shapes probe set
(`shapes_concepts`): its images with a mask per shape class, object, background and tone.
"""

from .dissection import CHUNK_BYTES, Concepts, Dissection, dissect
from .shapes_concepts import SHAPES_CONCEPTS, shapes_concepts

__all__ = ["CHUNK_BYTES", "SHAPES_CONCEPTS", "Concepts", "Dissection", "dissect", "shapes_concepts"]
