"""RefinerExplorer: one Refined-ViT block's maps stage by stage (softmax, expanded, convolved,
reduced; Refiner Fig. 3) for any block and image."""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
from torch import Tensor, nn

from ...hooks.inputs import check_images
from ...widgets.explorer import Explorer
from .analysis import RefinerStages, refined_blocks, refiner_stages
from .figures import refiner_stages_figure

__all__ = ["RefinerExplorer"]


class RefinerExplorer(Explorer):
    """Block and image sliders over `refiner_stages` of a model with `RefinerAttention`.

    Args:
        model: a Refined-ViT (``vizkit_refined_vit_*``); images: (B, C, H, W) batch.
    """

    def __init__(self, model: nn.Module, images: Tensor) -> None:
        super().__init__()
        self.model, self.images = model, check_images(model, images)
        self.blocks = refined_blocks(model)
        if not self.blocks:
            raise ValueError("The model has no attention refiner (use a vizkit_refined_vit_*).")
        self.block = widgets.SelectionSlider(options=self.blocks, description="block")
        self.image = widgets.IntSlider(0, 0, len(images) - 1, description="image")
        self.controls = [self.block, self.image]
        self._observe(*self.controls)
        self.refresh()

    def stages(self, block: int) -> RefinerStages:
        """The stages of ``block`` for the whole batch (computed once per block)."""
        return self.cached(block, lambda: refiner_stages(self.model, self.images, block))

    def _figure(self) -> go.Figure:
        return refiner_stages_figure(self.stages(self.block.value), image=self.image.value)
