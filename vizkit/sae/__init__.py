"""Sparse autoencoders on an activation store: `train_sae` fits one (TopK, BatchTopK or the
ReLU/L1 baseline) to one stored layer, `evaluate_sae` scores it on the store's rows (FVU, L0,
dead and dense latents), `spliced_score` runs the model with its reconstruction spliced in."""

from .autoencoder import KINDS as KINDS
from .autoencoder import SparseAutoencoder as SparseAutoencoder
from .evaluation import SAEScores as SAEScores
from .evaluation import evaluate_sae as evaluate_sae
from .spliced import SplicedScore as SplicedScore
from .spliced import spliced_score as spliced_score
from .training import train_sae as train_sae

__all__ = [
    "KINDS",
    "SAEScores",
    "SparseAutoencoder",
    "SplicedScore",
    "evaluate_sae",
    "spliced_score",
    "train_sae",
]
