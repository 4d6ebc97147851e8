"""SoT (Xie et al. 2022, "SoT: Delving Deeper into Classification Head for Transformer"): the
classification head of Sec. 3 (ClassT and WordT branches, MGCrP pooling, svPN), the SoT models,
the head's anatomy and per-branch analyses, and their figures."""

from .analysis import BranchPredictions as BranchPredictions
from .analysis import HeadAnatomy as HeadAnatomy
from .analysis import branch as branch
from .analysis import branch_gradcam as branch_gradcam
from .analysis import branch_predictions as branch_predictions
from .analysis import fig_s4_panels as fig_s4_panels
from .analysis import head_anatomy as head_anatomy
from .analysis import sot_head as sot_head
from .analysis import wordt_token_map as wordt_token_map
from .classification_head import FUSIONS as FUSIONS
from .classification_head import POOLS as POOLS
from .classification_head import SoTHead as SoTHead
from .classification_head import make_pool as make_pool
from .figures import branch_logits_figure as branch_logits_figure
from .figures import cross_covariance_figure as cross_covariance_figure
from .figures import maps_grid as maps_grid
from .figures import svpn_spectrum_figure as svpn_spectrum_figure
from .power_normalization import SVPN_EPS as SVPN_EPS
from .power_normalization import isqrt as isqrt
from .power_normalization import power_iteration as power_iteration
from .power_normalization import svpn as svpn
from .power_normalization import svpn_approx as svpn_approx
from .sot_pooling import CENTERINGS as CENTERINGS
from .sot_pooling import NORMALIZATIONS as NORMALIZATIONS
from .sot_pooling import GlobalAveragePooling as GlobalAveragePooling
from .sot_pooling import GlobalCovariancePooling as GlobalCovariancePooling
from .sot_pooling import MGCrP as MGCrP
from .sot_vit import PAPER_COUNTS as PAPER_COUNTS
from .sot_vit import DenseNetPatchEmbed as DenseNetPatchEmbed
from .sot_vit import SoTViT as SoTViT
from .sot_vit import sinusoid_table as sinusoid_table
from .sot_vit import with_sot_head as with_sot_head

__all__ = [
    "BranchPredictions",
    "CENTERINGS",
    "DenseNetPatchEmbed",
    "FUSIONS",
    "GlobalAveragePooling",
    "GlobalCovariancePooling",
    "HeadAnatomy",
    "MGCrP",
    "NORMALIZATIONS",
    "PAPER_COUNTS",
    "POOLS",
    "SVPN_EPS",
    "SoTHead",
    "SoTViT",
    "branch",
    "branch_gradcam",
    "branch_logits_figure",
    "branch_predictions",
    "cross_covariance_figure",
    "fig_s4_panels",
    "head_anatomy",
    "isqrt",
    "make_pool",
    "maps_grid",
    "power_iteration",
    "sinusoid_table",
    "sot_head",
    "svpn",
    "svpn_approx",
    "svpn_spectrum_figure",
    "with_sot_head",
    "wordt_token_map",
]
