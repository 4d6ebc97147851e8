"""Training: a small trainer with per-epoch callbacks, recipes."""

from .callbacks import AttentionEntropy as AttentionEntropy
from .trainer import Callback as Callback
from .trainer import TrainConfig as TrainConfig
from .trainer import evaluate as evaluate
from .trainer import train as train

__all__ = ["AttentionEntropy", "Callback", "TrainConfig", "evaluate", "train"]
