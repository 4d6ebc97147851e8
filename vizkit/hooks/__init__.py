"""The hook core: canonical activation names, temporary hooks, activation caches."""

from .adapters import build_taps as build_taps
from .attention_mode import unfused_attention as unfused_attention
from .cache import ActivationCache as ActivationCache
from .hook_point import HookPoint as HookPoint
from .hooked_model import HookedModel as HookedModel
from .hooked_model import HookFn as HookFn
from .hooked_model import frozen_parameters as frozen_parameters
from .layout import TokenLayout as TokenLayout
from .layout import token_layout as token_layout
from .layout import validate_input as validate_input
from .memory import saved_bytes as saved_bytes
from .names import resolve_names as resolve_names
from .taps import Tap as Tap
from .targets import Target as Target
from .targets import target_score as target_score

__all__ = [
    "ActivationCache",
    "HookFn",
    "HookPoint",
    "HookedModel",
    "Tap",
    "Target",
    "TokenLayout",
    "build_taps",
    "frozen_parameters",
    "resolve_names",
    "saved_bytes",
    "target_score",
    "token_layout",
    "unfused_attention",
    "validate_input",
]
