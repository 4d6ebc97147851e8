"""vizkit: see inside vision transformers.

Every registered saliency method is exported here under its function's name (``vk.gradcam``,
``vk.rollout``, ...), read from the registry (`vizkit.methods`), so a method is one file.
"""

from . import analysis as analysis
from . import circuits as circuits
from . import concepts as concepts
from . import datasets as datasets
from . import ledger as ledger
from . import methods as methods
from . import metrics as metrics
from . import models as models
from . import papers as papers
from . import registers as registers
from . import sae as sae
from . import store as store
from . import targets as targets
from . import text as text
from . import train as train
from . import viz as viz
from . import widgets as widgets
from . import zoo as zoo
from ._version import __version__ as __version__
from .analysis import AttentionResult as AttentionResult
from .analysis import CKAResult as CKAResult
from .analysis import FeatureEvolution as FeatureEvolution
from .analysis import ResidualRatios as ResidualRatios
from .analysis import SaliencyResult as SaliencyResult
from .analysis import ablation as ablation
from .analysis import activation_patching as activation_patching
from .analysis import attention as attention
from .analysis import cka as cka
from .analysis import cka_matrix as cka_matrix
from .analysis import direct_logit_attribution as direct_logit_attribution
from .analysis import feature_evolution as feature_evolution
from .analysis import logit_lens as logit_lens
from .analysis import residual_ratios as residual_ratios
from .analysis import token_norms as token_norms
from .analysis import token_pca as token_pca
from .circuits import attribution_patching as attribution_patching
from .hooks import ActivationCache as ActivationCache
from .hooks import HookedModel as HookedModel
from .hooks import HookPoint as HookPoint
from .hooks import TokenLayout as TokenLayout
from .hooks import token_layout as token_layout
from .hooks import unfused_attention as unfused_attention
from .methods.registry import METHODS as _METHODS
from .methods.smoothing import smoothed as smoothed
from .metrics import compare_saliency as compare_saliency
from .metrics import evaluate as evaluate
from .metrics import sanity_check as sanity_check
from .models import create_model as create_model
from .sae import train_sae as train_sae
from .store import cache_activations as cache_activations
from .text import embedding_decomposition as embedding_decomposition
from .text import text_span as text_span

__all__ = [
    "ActivationCache",
    "AttentionResult",
    "CKAResult",
    "FeatureEvolution",
    "HookPoint",
    "HookedModel",
    "ResidualRatios",
    "SaliencyResult",
    "TokenLayout",
    "__version__",
    "ablation",
    "activation_patching",
    "analysis",
    "attention",
    "attribution_patching",
    "cache_activations",
    "circuits",
    "concepts",
    "cka",
    "cka_matrix",
    "compare_saliency",
    "create_model",
    "datasets",
    "direct_logit_attribution",
    "embedding_decomposition",
    "evaluate",
    "feature_evolution",
    "ledger",
    "logit_lens",
    "methods",
    "metrics",
    "models",
    "papers",
    "registers",
    "residual_ratios",
    "sae",
    "sanity_check",
    "store",
    "smoothed",
    "text",
    "text_span",
    "token_layout",
    "token_norms",
    "token_pca",
    "train_sae",
    "unfused_attention",
    "viz",
    "widgets",
]

_METHOD_FUNCTIONS = {method.fn.__name__: method.fn for method in _METHODS.values()}
globals().update(_METHOD_FUNCTIONS)
__all__ += sorted(_METHOD_FUNCTIONS)
