"""Words for what a model sees: a CLIP-family image embedding split into the direct
contributions of layers, heads and tokens (`embedding_decomposition`), and each head described by
the texts that span its outputs over a data set (`text_span`; Gandelsman, Efros and Steinhardt
2024); the accuracy left when parts are mean-ablated (`mean_ablation`), the share of each head's
variance a labelling explains (`label_shares`), zero-shot segmentation maps (`text_maps`), and a
model without a text tower read through a linear map into a text-image model's space
(`fit_text_map`)."""

from .ablation import LabelShares as LabelShares
from .ablation import MeanAblation as MeanAblation
from .ablation import label_shares as label_shares
from .ablation import mean_ablated as mean_ablated
from .ablation import mean_ablation as mean_ablation
from .decomposition import EmbeddingDecomposition as EmbeddingDecomposition
from .decomposition import embedding_decomposition as embedding_decomposition
from .segmentation import text_maps as text_maps
from .span import SpannedTexts as SpannedTexts
from .span import TextSpan as TextSpan
from .span import decompose_images as decompose_images
from .span import span_texts as span_texts
from .span import text_span as text_span
from .text_map import TextMap as TextMap
from .text_map import fit_text_map as fit_text_map

__all__ = [
    "EmbeddingDecomposition",
    "LabelShares",
    "MeanAblation",
    "SpannedTexts",
    "TextMap",
    "TextSpan",
    "decompose_images",
    "embedding_decomposition",
    "fit_text_map",
    "label_shares",
    "mean_ablated",
    "mean_ablation",
    "span_texts",
    "text_maps",
    "text_span",
]
