"""The hook core: canonical activation names, temporary hooks, activation caches."""

from .adapters import build_taps as build_taps
from .attention_mode import unfused_attention as unfused_attention
from .cache import ActivationCache as ActivationCache
from .contract import analysis_contract as analysis_contract
from .contract import as_hooked as as_hooked
from .contract import eval_mode as eval_mode
from .contract import held as held
from .gradient_graph import frozen_parameters as frozen_parameters
from .heads import HeadSpec as HeadSpec
from .heads import reduce_heads as reduce_heads
from .hook_point import HookPoint as HookPoint
from .hooked_model import HookedModel as HookedModel
from .layout import TokenLayout as TokenLayout
from .layout import token_layout as token_layout
from .layout import validate_input as validate_input
from .memory import saved_bytes as saved_bytes
from .names import resolve_names as resolve_names
from .request import HookFn as HookFn
from .scores import Target as Target
from .scores import target_score as target_score
from .selector import LayerSpec as LayerSpec
from .selector import select_layer as select_layer
from .selector import select_layers as select_layers
from .taps import Tap as Tap

__all__ = [
    "ActivationCache",
    "HeadSpec",
    "HookFn",
    "HookPoint",
    "HookedModel",
    "Tap",
    "LayerSpec",
    "Target",
    "TokenLayout",
    "analysis_contract",
    "as_hooked",
    "build_taps",
    "eval_mode",
    "frozen_parameters",
    "held",
    "reduce_heads",
    "resolve_names",
    "saved_bytes",
    "select_layer",
    "select_layers",
    "target_score",
    "token_layout",
    "unfused_attention",
    "validate_input",
]
