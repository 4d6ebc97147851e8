"""vizkit: see inside vision transformers."""

from . import analysis as analysis
from . import datasets as datasets
from . import metrics as metrics
from . import models as models
from . import train as train
from . import zoo as zoo
from ._version import __version__ as __version__
from .analysis import AttentionResult as AttentionResult
from .analysis import SaliencyResult as SaliencyResult
from .analysis import attention as attention
from .analysis import class_attention as class_attention
from .analysis import grad_rollout as grad_rollout
from .analysis import gradcam as gradcam
from .analysis import integrated_gradients as integrated_gradients
from .analysis import occlusion as occlusion
from .analysis import rollout as rollout
from .analysis import saliency as saliency
from .hooks import ActivationCache as ActivationCache
from .hooks import HookedModel as HookedModel
from .hooks import HookPoint as HookPoint
from .hooks import TokenLayout as TokenLayout
from .hooks import token_layout as token_layout
from .hooks import unfused_attention as unfused_attention
from .metrics import compare_saliency as compare_saliency
from .models import create_model as create_model

__all__ = [
    "ActivationCache",
    "AttentionResult",
    "HookPoint",
    "HookedModel",
    "SaliencyResult",
    "TokenLayout",
    "__version__",
    "analysis",
    "attention",
    "class_attention",
    "compare_saliency",
    "create_model",
    "datasets",
    "grad_rollout",
    "gradcam",
    "integrated_gradients",
    "metrics",
    "models",
    "occlusion",
    "rollout",
    "saliency",
    "token_layout",
    "unfused_attention",
]
