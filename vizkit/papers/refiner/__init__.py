"""Refiner (Zhou et al. 2021, "Refiner: Refining Self-attention for Vision Transformers"):
attention expansion and convolution (Sec. 3.2-3.4), the refined ViT models, the stages of a
refined map, receptive field calibration (Sec. 4.4), their figures and the Refiner explorer."""

from .analysis import RefinerStages as RefinerStages
from .analysis import attend_local_values as attend_local_values
from .analysis import convolve_maps as convolve_maps
from .analysis import refined_blocks as refined_blocks
from .analysis import refiner_stages as refiner_stages
from .attention_refiner import CONSTRAINTS as CONSTRAINTS
from .attention_refiner import MODES as MODES
from .attention_refiner import AttentionRefiner as AttentionRefiner
from .crop_ratio import crop_ratio_accuracy as crop_ratio_accuracy
from .crop_ratio import crop_ratio_view as crop_ratio_view
from .figures import attention_depth_curves as attention_depth_curves
from .figures import attention_matrices as attention_matrices
from .figures import crop_ratio_curves as crop_ratio_curves
from .figures import refiner_stages_figure as refiner_stages_figure
from .figures import refiner_weights_figure as refiner_weights_figure
from .refined_vit import TINY_REFINED as TINY_REFINED
from .refined_vit import ConvStemPatchEmbed as ConvStemPatchEmbed
from .refined_vit import RefinedViT as RefinedViT
from .refined_vit import refined_vit_params as refined_vit_params
from .refiner_attention import AttentionRelay as AttentionRelay
from .refiner_attention import RefinerAttention as RefinerAttention
from .refiner_attention import clear_relays as clear_relays
from .refiner_explorer import RefinerExplorer as RefinerExplorer

__all__ = [
    "AttentionRefiner",
    "AttentionRelay",
    "CONSTRAINTS",
    "ConvStemPatchEmbed",
    "MODES",
    "RefinedViT",
    "RefinerAttention",
    "RefinerExplorer",
    "RefinerStages",
    "TINY_REFINED",
    "attend_local_values",
    "attention_depth_curves",
    "attention_matrices",
    "clear_relays",
    "convolve_maps",
    "crop_ratio_accuracy",
    "crop_ratio_curves",
    "crop_ratio_view",
    "refined_blocks",
    "refined_vit_params",
    "refiner_stages",
    "refiner_stages_figure",
    "refiner_weights_figure",
]
