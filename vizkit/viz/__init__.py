"""Figure builders: each turns an analysis result into a plotly figure (no computation here)."""

from ._style import display_images as display_images
from .attention import attention_grid as attention_grid
from .attention import attention_stats_figure as attention_stats_figure
from .attention import query_attention as query_attention
from .cait import class_attention_heads as class_attention_heads
from .cait import fig7_gallery as fig7_gallery
from .cait import talking_heads_matrices as talking_heads_matrices
from .masks import accuracy_vs_kernels_figure as accuracy_vs_kernels_figure
from .masks import folded_mask as folded_mask
from .masks import gaussian_fit_figure as gaussian_fit_figure
from .masks import gmm_parameters_figure as gmm_parameters_figure
from .masks import mask_evolution_figure as mask_evolution_figure
from .masks import mask_figure as mask_figure
from .masks import mask_layers_figure as mask_layers_figure
from .masks import radial_profiles_figure as radial_profiles_figure
from .masks import received_attention_figure as received_attention_figure
from .overlay import heatmap_on_image as heatmap_on_image
from .predictions import predictions_figure as predictions_figure
from .refiner import accuracy_over_seeds_figure as accuracy_over_seeds_figure
from .refiner import attention_depth_curves as attention_depth_curves
from .refiner import attention_matrices as attention_matrices
from .refiner import crop_ratio_curves as crop_ratio_curves
from .refiner import refiner_stages_figure as refiner_stages_figure
from .refiner import refiner_weights_figure as refiner_weights_figure
from .renderer import use_exportable_figures as use_exportable_figures
from .representations import cka_heatmap as cka_heatmap
from .representations import feature_evolution_curves as feature_evolution_curves
from .representations import layerscale_heatmap as layerscale_heatmap
from .representations import residual_ratio_curves as residual_ratio_curves
from .saliency import saliency_overlay as saliency_overlay
from .saliency import saliency_row as saliency_row
from .saliency import saliency_side_by_side as saliency_side_by_side
from .sot import branch_logits_figure as branch_logits_figure
from .sot import cross_covariance_figure as cross_covariance_figure
from .sot import maps_grid as maps_grid
from .sot import svpn_spectrum_figure as svpn_spectrum_figure
from .training import epoch_accuracy_curves as epoch_accuracy_curves
from .training import training_curves as training_curves

__all__ = [
    "accuracy_over_seeds_figure",
    "branch_logits_figure",
    "cross_covariance_figure",
    "maps_grid",
    "svpn_spectrum_figure",
    "attention_depth_curves",
    "attention_matrices",
    "attention_grid",
    "attention_stats_figure",
    "cka_heatmap",
    "crop_ratio_curves",
    "class_attention_heads",
    "display_images",
    "feature_evolution_curves",
    "fig7_gallery",
    "heatmap_on_image",
    "layerscale_heatmap",
    "accuracy_vs_kernels_figure",
    "folded_mask",
    "gaussian_fit_figure",
    "gmm_parameters_figure",
    "mask_evolution_figure",
    "mask_figure",
    "mask_layers_figure",
    "radial_profiles_figure",
    "received_attention_figure",
    "predictions_figure",
    "query_attention",
    "refiner_stages_figure",
    "refiner_weights_figure",
    "residual_ratio_curves",
    "saliency_overlay",
    "saliency_row",
    "saliency_side_by_side",
    "talking_heads_matrices",
    "epoch_accuracy_curves",
    "training_curves",
    "use_exportable_figures",
]
