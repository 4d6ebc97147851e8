"""vizkit: see inside vision transformers."""

from . import analysis as analysis
from . import datasets as datasets
from . import models as models
from . import train as train
from . import zoo as zoo
from ._version import __version__ as __version__
from .hooks import ActivationCache as ActivationCache
from .hooks import HookedModel as HookedModel
from .hooks import HookPoint as HookPoint
from .hooks import TokenLayout as TokenLayout
from .hooks import token_layout as token_layout
from .hooks import unfused_attention as unfused_attention
from .models import create_model as create_model

__all__ = [
    "ActivationCache",
    "HookPoint",
    "HookedModel",
    "TokenLayout",
    "__version__",
    "analysis",
    "create_model",
    "datasets",
    "models",
    "token_layout",
    "unfused_attention",
]
