"""Analyses: pure torch, no plotting. Each takes a model (or HookedModel) and a batch and returns
a result object with tensors and metadata."""

from .attention import AttentionResult as AttentionResult
from .attention import attention as attention
from .attention import reduce_heads as reduce_heads
from .captum_bridge import integrated_gradients as integrated_gradients
from .captum_bridge import occlusion as occlusion
from .captum_bridge import saliency as saliency
from .cka import cka as cka
from .cka_matrix import CKAResult as CKAResult
from .cka_matrix import FeatureEvolution as FeatureEvolution
from .cka_matrix import cka_matrix as cka_matrix
from .cka_matrix import feature_evolution as feature_evolution
from .class_attention import class_attention as class_attention
from .class_attention import modulated_gray as modulated_gray
from .crop_ratio import crop_ratio_accuracy as crop_ratio_accuracy
from .crop_ratio import crop_ratio_view as crop_ratio_view
from .entropy import normalized_entropy as normalized_entropy
from .gradcam import gradcam as gradcam
from .refiner import RefinerStages as RefinerStages
from .refiner import attend_local_values as attend_local_values
from .refiner import convolve_maps as convolve_maps
from .refiner import refiner_stages as refiner_stages
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
    "RefinerStages",
    "ResidualRatios",
    "SaliencyResult",
    "attend_local_values",
    "attention",
    "cka",
    "cka_matrix",
    "convolve_maps",
    "crop_ratio_accuracy",
    "crop_ratio_view",
    "class_attention",
    "feature_evolution",
    "grad_rollout",
    "gradcam",
    "integrated_gradients",
    "modulated_gray",
    "normalized_entropy",
    "occlusion",
    "ratio_uniformity",
    "reduce_heads",
    "refiner_stages",
    "residual_ratios",
    "rollout",
    "saliency",
]
