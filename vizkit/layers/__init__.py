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

__all__ = [
    "CONSTRAINTS",
    "RESIDUAL_STRATEGIES",
    "AttentionRefiner",
    "AttentionRelay",
    "ELMAttention",
    "ElementwiseMask",
    "GMMAttention",
    "GaussianMixtureMask",
    "MaskedAttention",
    "RefinerAttention",
    "ResidualBlock",
    "ResidualScale",
    "TalkingHeads",
    "clear_relays",
    "fixup_init",
]
