"""Interactive explorers (ipywidgets 8 + plotly FigureWidget) for JupyterLab; each also gives
its current view as a static figure (`static()`)."""

from .attention_explorer import AttentionExplorer as AttentionExplorer
from .circuit_explorer import CircuitExplorer as CircuitExplorer
from .cka_explorer import CKAExplorer as CKAExplorer
from .feature_browser import FeatureBrowser as FeatureBrowser
from .head_explorer import HeadExplorer as HeadExplorer
from .history_explorer import HistoryExplorer as HistoryExplorer
from .history_explorer import tracked_quantities as tracked_quantities
from .mechanistic_explorer import MechanisticExplorer as MechanisticExplorer
from .saliency_comparer import SaliencyComparer as SaliencyComparer

__all__ = [
    "AttentionExplorer",
    "CKAExplorer",
    "CircuitExplorer",
    "FeatureBrowser",
    "HeadExplorer",
    "HistoryExplorer",
    "MechanisticExplorer",
    "SaliencyComparer",
    "tracked_quantities",
]
