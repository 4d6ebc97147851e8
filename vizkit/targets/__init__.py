"""What a map explains where a class index names no score: a backbone's embedding (its norm,
its similarity to a reference or a text, a direction, a probe: `vizkit.targets.embeddings`) and
a dense output's pixels (a class over a mask or at a pixel, a region's depth:
`vizkit.targets.dense`). Each helper is a `ScoreTarget`: ``target=`` of every method, metric and
`compare_saliency` takes it."""

from .dense import DepthDifference as DepthDifference
from .dense import DepthRegion as DepthRegion
from .dense import MaskLogit as MaskLogit
from .dense import Pixel as Pixel
from .dense import Segment as Segment
from .dense import box_mask as box_mask
from .dense import dense_logits as dense_logits
from .dense import depth_difference as depth_difference
from .dense import depth_of as depth_of
from .dense import depth_region as depth_region
from .dense import mask_logit as mask_logit
from .dense import masks_of as masks_of
from .dense import pixel as pixel
from .dense import segment as segment
from .embeddings import EMBEDDING_KEYS as EMBEDDING_KEYS
from .embeddings import Direction as Direction
from .embeddings import EmbeddingNorm as EmbeddingNorm
from .embeddings import Probe as Probe
from .embeddings import SimilarTo as SimilarTo
from .embeddings import direction as direction
from .embeddings import embed as embed
from .embeddings import embedding_norm as embedding_norm
from .embeddings import embedding_of as embedding_of
from .embeddings import encode_texts as encode_texts
from .embeddings import pca_component as pca_component
from .embeddings import probe as probe
from .embeddings import prototypes as prototypes
from .embeddings import region as region
from .embeddings import similar_to as similar_to
from .embeddings import similar_to_region as similar_to_region
from .embeddings import text as text

__all__ = [
    "EMBEDDING_KEYS",
    "DepthDifference",
    "DepthRegion",
    "Direction",
    "EmbeddingNorm",
    "MaskLogit",
    "Pixel",
    "Probe",
    "Segment",
    "SimilarTo",
    "box_mask",
    "dense_logits",
    "depth_difference",
    "depth_of",
    "depth_region",
    "direction",
    "embed",
    "embedding_norm",
    "embedding_of",
    "encode_texts",
    "mask_logit",
    "masks_of",
    "pca_component",
    "pixel",
    "probe",
    "prototypes",
    "region",
    "segment",
    "similar_to",
    "similar_to_region",
    "text",
]
