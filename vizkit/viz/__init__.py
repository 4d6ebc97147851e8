"""Figure builders: each turns an analysis result into a plotly figure (no computation here)."""

from .attention import attention_grid as attention_grid
from .attention import attention_stats_figure as attention_stats_figure
from .attention import query_attention as query_attention
from .circuits import circuit_figure as circuit_figure
from .circuits import faithfulness_figure as faithfulness_figure
from .concepts import conditioned_maps_figure as conditioned_maps_figure
from .evaluation import curve_comparison as curve_comparison
from .evaluation import evaluation_bars as evaluation_bars
from .latents import latent_maps_figure as latent_maps_figure
from .mechanistic import logit_attribution_figure as logit_attribution_figure
from .mechanistic import logit_lens_maps as logit_lens_maps
from .mechanistic import patching_maps as patching_maps
from .overlay import heatmap_on_image as heatmap_on_image
from .predictions import predictions_figure as predictions_figure
from .renderer import use_exportable_figures as use_exportable_figures
from .representations import cka_heatmap as cka_heatmap
from .representations import feature_evolution_curves as feature_evolution_curves
from .representations import layerscale_heatmap as layerscale_heatmap
from .representations import residual_ratio_curves as residual_ratio_curves
from .saliency import saliency_overlay as saliency_overlay
from .saliency import saliency_row as saliency_row
from .saliency import saliency_side_by_side as saliency_side_by_side
from .sanity import sanity_curves as sanity_curves
from .sanity import sanity_maps as sanity_maps
from .style import display_images as display_images
from .tokens import register_effect_figure as register_effect_figure
from .tokens import token_norms_figure as token_norms_figure
from .tokens import token_pca_figure as token_pca_figure
from .training import accuracy_over_seeds_figure as accuracy_over_seeds_figure
from .training import epoch_accuracy_curves as epoch_accuracy_curves
from .training import scale_trend as scale_trend
from .training import training_curves as training_curves
from .video import video_saliency as video_saliency

__all__ = [
    "accuracy_over_seeds_figure",
    "attention_grid",
    "attention_stats_figure",
    "circuit_figure",
    "cka_heatmap",
    "conditioned_maps_figure",
    "curve_comparison",
    "display_images",
    "evaluation_bars",
    "faithfulness_figure",
    "latent_maps_figure",
    "logit_attribution_figure",
    "logit_lens_maps",
    "patching_maps",
    "feature_evolution_curves",
    "heatmap_on_image",
    "layerscale_heatmap",
    "predictions_figure",
    "query_attention",
    "residual_ratio_curves",
    "saliency_overlay",
    "saliency_row",
    "saliency_side_by_side",
    "sanity_curves",
    "sanity_maps",
    "epoch_accuracy_curves",
    "register_effect_figure",
    "token_norms_figure",
    "token_pca_figure",
    "scale_trend",
    "training_curves",
    "video_saliency",
    "use_exportable_figures",
]
