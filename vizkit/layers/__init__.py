"""Paper mechanisms as timm-compatible modules, one per file."""

from .residual_block import ResidualBlock as ResidualBlock
from .residual_block import TalkingHeads as TalkingHeads
from .residual_block import fixup_init as fixup_init
from .residual_scale import RESIDUAL_STRATEGIES as RESIDUAL_STRATEGIES
from .residual_scale import ResidualScale as ResidualScale

__all__ = ["RESIDUAL_STRATEGIES", "ResidualBlock", "ResidualScale", "TalkingHeads", "fixup_init"]
