"""Analyses: pure torch, no plotting. Each takes a model (or HookedModel) and a batch and returns
a result object with tensors and metadata."""

from ._model import self_attention_names as self_attention_names
from .attention_maps import AttentionResult as AttentionResult
from .attention_maps import attention as attention
from .attention_maps import stage_layers as stage_layers
from .cka_kernels import cka as cka
from .entropy import normalized_entropy as normalized_entropy
from .layer_cka import CKAResult as CKAResult
from .layer_cka import FeatureEvolution as FeatureEvolution
from .layer_cka import cka_matrix as cka_matrix
from .layer_cka import feature_evolution as feature_evolution
from .logit_attribution import LogitAttribution as LogitAttribution
from .logit_attribution import direct_logit_attribution as direct_logit_attribution
from .logit_lens import LogitLens as LogitLens
from .logit_lens import logit_lens as logit_lens
from .patching import AblationResult as AblationResult
from .patching import PatchingResult as PatchingResult
from .patching import ablation as ablation
from .patching import activation_patching as activation_patching
from .residual_norms import LayerScale as LayerScale
from .residual_norms import ResidualRatios as ResidualRatios
from .residual_norms import layerscale as layerscale
from .residual_norms import ratio_uniformity as ratio_uniformity
from .residual_norms import residual_ratios as residual_ratios
from .saliency_result import SaliencyResult as SaliencyResult
from .stages import Stages as Stages
from .token_norms import TokenNorms as TokenNorms
from .token_norms import token_norms as token_norms
from .token_pca import TokenPCA as TokenPCA
from .token_pca import token_pca as token_pca

__all__ = [
    "AblationResult",
    "AttentionResult",
    "Stages",
    "CKAResult",
    "FeatureEvolution",
    "LayerScale",
    "LogitAttribution",
    "LogitLens",
    "PatchingResult",
    "ResidualRatios",
    "SaliencyResult",
    "TokenNorms",
    "TokenPCA",
    "ablation",
    "activation_patching",
    "attention",
    "cka",
    "cka_matrix",
    "direct_logit_attribution",
    "feature_evolution",
    "layerscale",
    "logit_lens",
    "normalized_entropy",
    "ratio_uniformity",
    "residual_ratios",
    "self_attention_names",
    "stage_layers",
    "token_norms",
    "token_pca",
]
