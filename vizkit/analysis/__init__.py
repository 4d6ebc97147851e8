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
from .class_attention import modulated_gray as modulated_gray
from .crop_ratio import crop_ratio_accuracy as crop_ratio_accuracy
from .crop_ratio import crop_ratio_view as crop_ratio_view
from .entropy import normalized_entropy as normalized_entropy
from .gradcam import gradcam as gradcam
from .masks import GaussianFit as GaussianFit
from .masks import MaskLocality as MaskLocality
from .masks import fit_gaussian_mixture as fit_gaussian_mixture
from .masks import gmm_masks_over_training as gmm_masks_over_training
from .masks import gmm_parameters as gmm_parameters
from .masks import learned_masks as learned_masks
from .masks import mask_locality as mask_locality
from .masks import mask_receptive_field as mask_receptive_field
from .masks import radial_profile as radial_profile
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
from .sot import BranchPredictions as BranchPredictions
from .sot import HeadAnatomy as HeadAnatomy
from .sot import branch_gradcam as branch_gradcam
from .sot import branch_predictions as branch_predictions
from .sot import fig_s4_panels as fig_s4_panels
from .sot import head_anatomy as head_anatomy
from .sot import wordt_token_map as wordt_token_map

__all__ = [
    "AttentionResult",
    "BranchPredictions",
    "CKAResult",
    "FeatureEvolution",
    "GaussianFit",
    "HeadAnatomy",
    "MaskLocality",
    "RefinerStages",
    "ResidualRatios",
    "SaliencyResult",
    "attend_local_values",
    "attention",
    "branch_gradcam",
    "branch_predictions",
    "cka",
    "cka_matrix",
    "class_attention",
    "convolve_maps",
    "crop_ratio_accuracy",
    "crop_ratio_view",
    "feature_evolution",
    "fig_s4_panels",
    "fit_gaussian_mixture",
    "gmm_masks_over_training",
    "gmm_parameters",
    "grad_rollout",
    "gradcam",
    "head_anatomy",
    "integrated_gradients",
    "learned_masks",
    "mask_locality",
    "mask_receptive_field",
    "modulated_gray",
    "normalized_entropy",
    "occlusion",
    "radial_profile",
    "ratio_uniformity",
    "reduce_heads",
    "refiner_stages",
    "residual_ratios",
    "rollout",
    "saliency",
    "self_attention_names",
    "stage_layers",
    "wordt_token_map",
]
