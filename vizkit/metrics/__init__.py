"""Faithfulness (deletion/insertion) and localization (against object masks) of saliency maps,
and whether a prediction is far enough from chance for them to mean anything."""

from .chance import Predictions as Predictions
from .chance import near_chance as near_chance
from .chance import prediction_certainty as prediction_certainty
from .chance import predictions as predictions
from .compare import compare_saliency as compare_saliency
from .complexity import complexity as complexity
from .complexity import sparseness as sparseness
from .confidence import average_drop as average_drop
from .confidence import increase_in_confidence as increase_in_confidence
from .correlation import faithfulness_correlation as faithfulness_correlation
from .evaluate import evaluate as evaluate
from .faithfulness import CurveResult as CurveResult
from .faithfulness import deletion as deletion
from .faithfulness import insertion as insertion
from .localization import energy_in_mask as energy_in_mask
from .localization import pointing_game as pointing_game
from .localization import relevance_mass_accuracy as relevance_mass_accuracy
from .localization import relevance_rank_accuracy as relevance_rank_accuracy
from .localization import top_iou as top_iou
from .object_shares import mask_shares as mask_shares
from .registry import METRICS as METRICS
from .registry import Metric as Metric
from .registry import ScoredBatch as ScoredBatch
from .registry import metric as metric
from .road import road as road
from .robustness import max_sensitivity as max_sensitivity
from .sanity import SanityResult as SanityResult
from .sanity import data_randomization as data_randomization
from .sanity import sanity_check as sanity_check
from .table import SaliencyTable as SaliencyTable

__all__ = [
    "METRICS",
    "Metric",
    "ScoredBatch",
    "metric",
    "evaluate",
    "average_drop",
    "complexity",
    "data_randomization",
    "faithfulness_correlation",
    "increase_in_confidence",
    "mask_shares",
    "max_sensitivity",
    "relevance_mass_accuracy",
    "relevance_rank_accuracy",
    "road",
    "sparseness",
    "CurveResult",
    "SaliencyTable",
    "compare_saliency",
    "deletion",
    "energy_in_mask",
    "insertion",
    "near_chance",
    "pointing_game",
    "prediction_certainty",
    "predictions",
    "Predictions",
    "sanity_check",
    "SanityResult",
    "top_iou",
]
