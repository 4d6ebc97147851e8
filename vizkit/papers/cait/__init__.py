"""CaiT (Touvron et al. 2021, "Going deeper with Image Transformers"): LayerScale and the other
residual-branch strategies of Sec. 2 and Table 1, talking-heads attention, the registered
``vizkit_vit_tiny_*`` / ``vizkit_cait_tiny_*`` models, Fig. 7's modulated images, the
class-attention and talking-heads figures and the LayerScale explorer."""

from .analysis import TalkingHeadsMixing as TalkingHeadsMixing
from .analysis import modulated_gray as modulated_gray
from .analysis import talking_heads as talking_heads
from .cait_family import PAPER_TABLE3 as PAPER_TABLE3
from .cait_family import CaitFamilyRow as CaitFamilyRow
from .cait_family import cait_family_table as cait_family_table
from .cait_variants import LateClassTokenViT as LateClassTokenViT
from .cait_variants import residual_vit as residual_vit
from .figures import class_attention_heads as class_attention_heads
from .figures import fig7_gallery as fig7_gallery
from .figures import talking_heads_matrices as talking_heads_matrices
from .layerscale_explorer import LayerScaleExplorer as LayerScaleExplorer
from .residual_block import ResidualBlock as ResidualBlock
from .residual_block import TalkingHeads as TalkingHeads
from .residual_block import fixup_init as fixup_init
from .residual_scale import RESIDUAL_STRATEGIES as RESIDUAL_STRATEGIES
from .residual_scale import ResidualScale as ResidualScale

__all__ = [
    "modulated_gray",
    "CaitFamilyRow",
    "LateClassTokenViT",
    "LayerScaleExplorer",
    "PAPER_TABLE3",
    "RESIDUAL_STRATEGIES",
    "ResidualBlock",
    "ResidualScale",
    "TalkingHeads",
    "TalkingHeadsMixing",
    "cait_family_table",
    "class_attention_heads",
    "fig7_gallery",
    "fixup_init",
    "residual_vit",
    "talking_heads",
    "talking_heads_matrices",
]
