"""Sparse autoencoders on an activation store: `train_sae` fits one (TopK, BatchTopK or the
ReLU/L1 baseline) to one stored layer, `evaluate_sae` scores it on the store's rows (FVU, L0,
dead and dense latents), `spliced_score` runs the model with its reconstruction spliced in;
`features` reads what each latent responds to from the store, `logit_effects` what it writes
to the logits directly, `ablate` and `steer` what it does through the model."""

from .autoencoder import KINDS as KINDS
from .autoencoder import SparseAutoencoder as SparseAutoencoder
from .effects import Intervention as Intervention
from .effects import LogitEffects as LogitEffects
from .effects import ablate as ablate
from .effects import logit_effects as logit_effects
from .effects import steer as steer
from .evaluation import SAEScores as SAEScores
from .evaluation import evaluate_sae as evaluate_sae
from .latent_stats import ClassDetectors as ClassDetectors
from .latent_stats import Features as Features
from .latent_stats import MaskShare as MaskShare
from .latent_stats import features as features
from .maps import latent_maps as latent_maps
from .spliced import SplicedScore as SplicedScore
from .spliced import spliced_score as spliced_score
from .training import train_sae as train_sae

__all__ = [
    "KINDS",
    "ClassDetectors",
    "Features",
    "Intervention",
    "LogitEffects",
    "MaskShare",
    "SAEScores",
    "SparseAutoencoder",
    "SplicedScore",
    "ablate",
    "evaluate_sae",
    "features",
    "latent_maps",
    "logit_effects",
    "spliced_score",
    "steer",
    "train_sae",
]
