"""Analyses: pure torch, no plotting. Each takes a model (or HookedModel) and a batch and returns
a result object with tensors and metadata."""

from .attention import AttentionResult as AttentionResult
from .attention import attention as attention
from .attention import reduce_heads as reduce_heads
from .captum_bridge import integrated_gradients as integrated_gradients
from .captum_bridge import occlusion as occlusion
from .captum_bridge import saliency as saliency
from .class_attention import class_attention as class_attention
from .class_attention import modulated_gray as modulated_gray
from .entropy import normalized_entropy as normalized_entropy
from .gradcam import gradcam as gradcam
from .rollout import grad_rollout as grad_rollout
from .rollout import rollout as rollout
from .saliency_result import SaliencyResult as SaliencyResult

__all__ = [
    "AttentionResult",
    "SaliencyResult",
    "attention",
    "class_attention",
    "grad_rollout",
    "gradcam",
    "integrated_gradients",
    "modulated_gray",
    "normalized_entropy",
    "occlusion",
    "reduce_heads",
    "rollout",
    "saliency",
]
