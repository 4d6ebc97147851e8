"""Learned attention masks (Li and Zhang 2023, "Toward a Deeper Understanding: RetNet Viewed
through Convolution"): the element-wise (ELM) and Gaussian-mixture (GMM) masks of Sec. 3, the
masked ViTs, the decays the paper starts from (RetNet's, RMT's, a local window; Fig. 2), reading
the masks out of a model, Gaussian fits (Fig. 4) and their figures."""

from .analysis import GaussianFit as GaussianFit
from .analysis import MaskLocality as MaskLocality
from .analysis import fit_gaussian_mixture as fit_gaussian_mixture
from .analysis import gmm_masks_over_training as gmm_masks_over_training
from .analysis import gmm_parameters as gmm_parameters
from .analysis import learned_masks as learned_masks
from .analysis import mask_locality as mask_locality
from .analysis import mask_receptive_field as mask_receptive_field
from .analysis import masked_layers as masked_layers
from .analysis import radial_profile as radial_profile
from .attention_masks import DecayMask as DecayMask
from .attention_masks import ElementwiseMask as ElementwiseMask
from .attention_masks import GaussianMixtureMask as GaussianMixtureMask
from .attention_masks import LocalMask as LocalMask
from .attention_masks import grid_square_distances as grid_square_distances
from .figures import accuracy_vs_kernels_figure as accuracy_vs_kernels_figure
from .figures import folded_mask as folded_mask
from .figures import gaussian_fit_figure as gaussian_fit_figure
from .figures import gmm_parameters_figure as gmm_parameters_figure
from .figures import mask_evolution_figure as mask_evolution_figure
from .figures import mask_figure as mask_figure
from .figures import mask_layers_figure as mask_layers_figure
from .figures import masks_as_kernels_figure as masks_as_kernels_figure
from .figures import radial_profiles_figure as radial_profiles_figure
from .figures import received_attention_figure as received_attention_figure
from .masked_attention import ELMAttention as ELMAttention
from .masked_attention import GMMAttention as GMMAttention
from .masked_attention import MaskedAttention as MaskedAttention
from .masked_vit import DECAY_MASKS as DECAY_MASKS
from .masked_vit import MASKS as MASKS
from .masked_vit import PAPER_CONFIGS as PAPER_CONFIGS
from .masked_vit import PAPER_COUNTS as PAPER_COUNTS
from .masked_vit import MaskedViT as MaskedViT
from .masked_vit import masked_vit_params as masked_vit_params
from .report_section import masks_section as masks_section
from .tracker import LearnedMasksTracker as LearnedMasksTracker

__all__ = [
    "DECAY_MASKS",
    "DecayMask",
    "ELMAttention",
    "ElementwiseMask",
    "GMMAttention",
    "GaussianFit",
    "GaussianMixtureMask",
    "LearnedMasksTracker",
    "LocalMask",
    "MASKS",
    "MaskLocality",
    "MaskedAttention",
    "MaskedViT",
    "PAPER_CONFIGS",
    "PAPER_COUNTS",
    "accuracy_vs_kernels_figure",
    "fit_gaussian_mixture",
    "folded_mask",
    "gaussian_fit_figure",
    "gmm_masks_over_training",
    "gmm_parameters",
    "gmm_parameters_figure",
    "grid_square_distances",
    "learned_masks",
    "mask_evolution_figure",
    "mask_figure",
    "mask_layers_figure",
    "mask_locality",
    "masks_as_kernels_figure",
    "mask_receptive_field",
    "masks_section",
    "masked_layers",
    "masked_vit_params",
    "radial_profile",
    "radial_profiles_figure",
    "received_attention_figure",
]
