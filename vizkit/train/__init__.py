"""Training: a small trainer with per-epoch trackers, recipes, sweeps of recipes."""

from .callbacks import TRACKERS as TRACKERS
from .callbacks import AttentionEntropyTracker as AttentionEntropyTracker
from .callbacks import CKAToPreviousTracker as CKAToPreviousTracker
from .callbacks import LayerScaleTracker as LayerScaleTracker
from .callbacks import ResidualRatiosTracker as ResidualRatiosTracker
from .history import tracked_results as tracked_results
from .sweep import run_recipes as run_recipes
from .trainer import Callback as Callback
from .trainer import TrainConfig as TrainConfig
from .trainer import loss_and_accuracy as loss_and_accuracy
from .trainer import train as train

__all__ = [
    "TRACKERS",
    "AttentionEntropyTracker",
    "CKAToPreviousTracker",
    "Callback",
    "LayerScaleTracker",
    "ResidualRatiosTracker",
    "TrainConfig",
    "loss_and_accuracy",
    "run_recipes",
    "tracked_results",
    "train",
]
