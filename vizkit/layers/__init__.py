"""Paper mechanisms as timm-compatible modules, one per file."""

from .attention_masks import ElementwiseMask as ElementwiseMask
from .attention_masks import GaussianMixtureMask as GaussianMixtureMask
from .attention_refiner import CONSTRAINTS as CONSTRAINTS
from .attention_refiner import AttentionRefiner as AttentionRefiner
from .masked_attention import ELMAttention as ELMAttention
from .masked_attention import GMMAttention as GMMAttention
from .masked_attention import MaskedAttention as MaskedAttention
from .refiner_attention import AttentionRelay as AttentionRelay
from .refiner_attention import RefinerAttention as RefinerAttention
from .refiner_attention import clear_relays as clear_relays
from .residual_block import ResidualBlock as ResidualBlock
from .residual_block import TalkingHeads as TalkingHeads
from .residual_block import fixup_init as fixup_init
from .residual_scale import RESIDUAL_STRATEGIES as RESIDUAL_STRATEGIES
from .residual_scale import ResidualScale as ResidualScale
from .sot_head import FUSIONS as FUSIONS
from .sot_head import POOLS as POOLS
from .sot_head import SoTHead as SoTHead
from .sot_pooling import GlobalAveragePooling as GlobalAveragePooling
from .sot_pooling import GlobalCovariancePooling as GlobalCovariancePooling
from .sot_pooling import MGCrP as MGCrP
from .svpn import isqrt as isqrt
from .svpn import power_iteration as power_iteration
from .svpn import svpn as svpn
from .svpn import svpn_approx as svpn_approx

__all__ = [
    "CONSTRAINTS",
    "FUSIONS",
    "POOLS",
    "RESIDUAL_STRATEGIES",
    "AttentionRefiner",
    "AttentionRelay",
    "ELMAttention",
    "ElementwiseMask",
    "GMMAttention",
    "GaussianMixtureMask",
    "GlobalAveragePooling",
    "GlobalCovariancePooling",
    "MGCrP",
    "MaskedAttention",
    "RefinerAttention",
    "ResidualBlock",
    "ResidualScale",
    "SoTHead",
    "TalkingHeads",
    "clear_relays",
    "fixup_init",
    "isqrt",
    "power_iteration",
    "svpn",
    "svpn_approx",
]
