"""Analyses: pure torch, no plotting. Each takes a model (or HookedModel) and a batch and returns
a result object with tensors and metadata."""

from ._model import self_attention_names as self_attention_names
from .attention import AttentionResult as AttentionResult
from .attention import attention as attention
from .attention import reduce_heads as reduce_heads
from .attention import stage_layers as stage_layers
from .captum_bridge import integrated_gradients as integrated_gradients
from .captum_bridge import occlusion as occlusion
from .captum_bridge import saliency as saliency
from .cka import cka as cka
from .cka_matrix import CKAResult as CKAResult
from .cka_matrix import FeatureEvolution as FeatureEvolution
from .cka_matrix import cka_matrix as cka_matrix
from .cka_matrix import feature_evolution as feature_evolution
from .class_attention import class_attention as class_attention
from .entropy import normalized_entropy as normalized_entropy
from .gradcam import gradcam as gradcam
from .residual_ratios import ResidualRatios as ResidualRatios
from .residual_ratios import ratio_uniformity as ratio_uniformity
from .residual_ratios import residual_ratios as residual_ratios
from .rollout import grad_rollout as grad_rollout
from .rollout import rollout as rollout
from .saliency_result import SaliencyResult as SaliencyResult

__all__ = [
    "AttentionResult",
    "CKAResult",
    "FeatureEvolution",
    "ResidualRatios",
    "SaliencyResult",
    "attention",
    "cka",
    "cka_matrix",
    "class_attention",
    "feature_evolution",
    "grad_rollout",
    "gradcam",
    "integrated_gradients",
    "normalized_entropy",
    "occlusion",
    "ratio_uniformity",
    "reduce_heads",
    "residual_ratios",
    "rollout",
    "saliency",
    "self_attention_names",
    "stage_layers",
]
