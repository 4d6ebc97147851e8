"""Training: a small trainer with per-epoch trackers, recipes."""

from .callbacks import TRACKERS as TRACKERS
from .callbacks import AttentionEntropy as AttentionEntropy
from .callbacks import CKAToPrevious as CKAToPrevious
from .callbacks import LayerScaleStats as LayerScaleStats
from .callbacks import ResidualRatios as ResidualRatios
from .trainer import Callback as Callback
from .trainer import TrainConfig as TrainConfig
from .trainer import evaluate as evaluate
from .trainer import train as train

__all__ = [
    "TRACKERS",
    "AttentionEntropy",
    "CKAToPrevious",
    "Callback",
    "LayerScaleStats",
    "ResidualRatios",
    "TrainConfig",
    "evaluate",
    "train",
]
