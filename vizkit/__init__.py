"""vizkit: see inside vision transformers."""

from . import analysis as analysis
from . import datasets as datasets
from . import methods as methods
from . import metrics as metrics
from . import models as models
from . import papers as papers
from . import targets as targets
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
from .analysis import class_attention as class_attention
from .analysis import direct_logit_attribution as direct_logit_attribution
from .analysis import feature_evolution as feature_evolution
from .analysis import grad_rollout as grad_rollout
from .analysis import gradcam as gradcam
from .analysis import integrated_gradients as integrated_gradients
from .analysis import logit_lens as logit_lens
from .analysis import occlusion as occlusion
from .analysis import residual_ratios as residual_ratios
from .analysis import rollout as rollout
from .analysis import saliency as saliency
from .analysis import token_norms as token_norms
from .analysis import token_pca as token_pca
from .hooks import ActivationCache as ActivationCache
from .hooks import HookedModel as HookedModel
from .hooks import HookPoint as HookPoint
from .hooks import TokenLayout as TokenLayout
from .hooks import token_layout as token_layout
from .hooks import unfused_attention as unfused_attention
from .methods.ablationcam import ablationcam as ablationcam
from .methods.attnlrp import attnlrp as attnlrp
from .methods.eigencam import eigencam as eigencam
from .methods.gradcam_pp import gradcam_pp as gradcam_pp
from .methods.gradientshap import gradientshap as gradientshap
from .methods.hirescam import hirescam as hirescam
from .methods.layercam import layercam as layercam
from .methods.legrad import legrad as legrad
from .methods.scorecam import scorecam as scorecam
from .methods.smoothgrad import smoothgrad as smoothgrad
from .methods.smoothing import smoothed as smoothed
from .methods.transformer_attribution import transformer_attribution as transformer_attribution
from .methods.xgradcam import xgradcam as xgradcam
from .metrics import compare_saliency as compare_saliency
from .metrics import evaluate as evaluate
from .metrics import sanity_check as sanity_check
from .models import create_model as create_model

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
    "ablationcam",
    "activation_patching",
    "analysis",
    "attention",
    "attnlrp",
    "cka",
    "cka_matrix",
    "class_attention",
    "compare_saliency",
    "create_model",
    "datasets",
    "direct_logit_attribution",
    "eigencam",
    "evaluate",
    "feature_evolution",
    "grad_rollout",
    "gradcam",
    "gradcam_pp",
    "gradientshap",
    "hirescam",
    "integrated_gradients",
    "layercam",
    "legrad",
    "logit_lens",
    "methods",
    "metrics",
    "models",
    "occlusion",
    "papers",
    "residual_ratios",
    "rollout",
    "saliency",
    "sanity_check",
    "scorecam",
    "smoothed",
    "smoothgrad",
    "token_layout",
    "token_norms",
    "token_pca",
    "transformer_attribution",
    "unfused_attention",
    "viz",
    "widgets",
    "xgradcam",
]
