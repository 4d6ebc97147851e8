"""SaliencyComparer: saliency methods side by side on a chosen image, with their scores."""

from __future__ import annotations

import math
from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from torch import Tensor, nn

from ..hooks import Target
from ..hooks.inputs import check_images
from ..hooks.scores import is_score_target, model_logits, require_class_logits, select_images
from ..metrics import compare_saliency, evaluate, road, sanity_check
from ..viz import display_images
from ..viz.evaluation import curve_comparison, evaluation_bars
from ..viz.fit import COLORBAR_PX
from ..viz.saliency import side_by_side
from ..viz.sanity import sanity_maps
from .explorer import Explorer
from .redraw import PLOTLY_WIDTH

__all__ = ["SaliencyComparer"]

VIEWS = ["maps", "ROAD curves", "sanity check", "all images"]
# the narrowest panels at the figure's width: a metric's bars (a title such as
# "relevance_mass_accuracy ↑" at 12 px), a sanity map (its title's longest word)
EVALUATION_PANEL_PX, SANITY_PANEL_PX = 175, 85


class SaliencyComparer(Explorer):
    """Saliency methods on one image at a time: maps side by side, each image's deletion and
    insertion AUC (and, with ``masks``, pointing game, energy in the mask, IoU) in the titles,
    and a warning in the title where the prediction is near chance. Each image is scored on its
    first visit, with a progress bar (and a line beside the slider saying what is being scored,
    then what it cost), and cached; revisiting only redraws.

    Args:
        images: (B, C, H, W) normalized for the model; masks: (B, H, W) bool object masks.
        methods: names of `vizkit.methods.METHODS`, "all" (every registered method) or
            "default" (the registry's defaults, `vizkit.methods.default_methods`, as the
            report). The ``method`` menu switches between all of them side by side and one;
            the ``view`` buttons between the maps with their scores, the methods' ROAD curves
            on the image (MoRF and LeRF, `vizkit.metrics.road`), the method's sanity check on
            the image (its maps as the model's layers are randomized from the top,
            `vizkit.metrics.sanity_check`; "all" shows the first method's) and every metric
            of `vizkit.evaluate` over all the images (means with standard errors; computed on
            the first visit, for the predicted classes or the score target).
        target: what the maps explain: None (each image's predicted class), a class index, or
            a score target (`vizkit.targets`: a backbone's embedding norm, similarity to a
            reference, a text prompt...), which a backbone needs (it has no classes).
        steps: steps of the deletion/insertion curves. 8 keeps a new image quick (about half
            the forward passes of 16; on the Shapes sample its AUCs differ from 64 steps' by
            0.02 on average); ``steps=None`` scores as `compare_saliency` does by default
            (16 steps), ``steps=64`` finer still at about 7x the forward passes of 8.
        progress: show a progress bar while an image is scored.
    """

    def __init__(
        self,
        model: nn.Module,
        images: Tensor,
        masks: Tensor | None = None,
        methods: str | Sequence[str] = "default",
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        steps: int | None = 8,
        progress: bool = True,
        target: Target = None,
    ) -> None:
        super().__init__()
        self.model, self.images = model, check_images(model, images)
        require_class_logits(model, target)
        self.target = torch.as_tensor(target) if isinstance(target, list | tuple) else target
        if masks is not None and tuple(masks.shape) != (len(images), *images.shape[-2:]):
            raise ValueError(
                f"masks must be (B, H, W) = ({len(images)}, {images.shape[-2]}, "
                f"{images.shape[-1]}) to match the images; got {tuple(masks.shape)}."
            )
        self.masks = masks
        self.methods = _resolve_names(model, methods)
        self.display = display_images(images, model, mean, std)
        self.steps, self.progress = steps, progress
        self.image = widgets.IntSlider(0, 0, len(images) - 1, description="image")
        self.method = widgets.Dropdown(options=["all", *self.methods], description="method")
        self.view = widgets.ToggleButtons(options=VIEWS, description="view")
        self.status = widgets.Label()  # what scoring is under way, or what it cost
        self.controls = [self.image, self.method, self.view, self.status]
        self._observe(self.image, self.method, self.view)
        self.refresh()

    def table(self, image: int):
        """The `SaliencyTable` of one image (computed on first use)."""
        masks = None if self.masks is None else self.masks[image : image + 1]
        x = self.images[image : image + 1]

        def score():
            count = f"{len(self.methods)} method" + "s" * (len(self.methods) != 1)
            self.status.value = f"scoring image {image} with {count}…"
            return compare_saliency(
                self.model, x, self.methods, target=self._target_of(image), masks=masks,
                steps=self.steps, progress=self.progress,
            )  # fmt: skip

        return self.cached(image, score)

    def sanity(self, image: int, method: str):
        """The cascading randomization test of ``method`` on one image (computed on first
        use)."""

        def check():
            self.status.value = f"randomizing the model's layers for {method} on image {image}…"
            return sanity_check(self.model, self.images[image : image + 1], method,
                                target=self._target_of(image), progress=self.progress)  # fmt: skip

        return self.cached((image, "sanity", method), check)

    def road_curves(self, image: int) -> dict:
        """Each scored method's ROAD MoRF and LeRF curves on one image (computed on first use)."""

        def curves():
            self.status.value = f"removing and imputing image {image}'s pixels per method…"
            x, results = self.images[image : image + 1], self.table(image).results
            target = self._target_of(image) if is_score_target(self.target) else None
            return {name: [road(self.model, x, result, target, order) for order in ("morf", "lerf")]
                    for name, result in results.items()}  # fmt: skip

        return self.cached((image, "road"), curves)

    def evaluation(self):
        """`vizkit.evaluate` of the methods over every image (computed on first use)."""

        def run():
            self.status.value = f"evaluating {len(self.methods)} methods on every image…"
            if is_score_target(self.target):
                targets, classes = self.target, torch.zeros(len(self.images), dtype=torch.long)
            else:
                with torch.no_grad():
                    predicted = model_logits(self.model(self.images)).argmax(-1)
                classes = predicted if self.target is None else torch.as_tensor(
                    self.target).expand(len(self.images))  # fmt: skip
                targets = "labels"
            data = (self.images, classes) + ((self.masks,) if self.masks is not None else ())
            return evaluate(self.model, data, self.methods, targets=targets,
                            progress=self.progress)  # fmt: skip

        return self.cached("evaluation", run)

    def _target_of(self, image: int) -> Target:
        """The target of image ``image`` alone: a score target's rows for it, a class index
        (one per image, or one for all), or None."""
        if is_score_target(self.target):
            return select_images(self.target, torch.tensor([image]))
        if isinstance(self.target, torch.Tensor) and self.target.ndim:
            return self.target[image : image + 1]
        return self.target

    def _per_row(self, panel: int, most: int, beside: int = 0) -> int:
        """Panels of at least ``panel`` px to a row at the width the figure is drawn at (at
        most ``most``; ``beside``: px a colour bar takes)."""
        plot = (self._plot.width or PLOTLY_WIDTH) - 70 - beside
        return max(1, min(most, plot // panel))

    def _figure(self) -> go.Figure:
        i = self.image.value
        refused = ""
        if self.view.value == "all images":
            try:
                table = self.evaluation()
            except ValueError as error:  # e.g. a target that differs by image
                refused = f"; no evaluation over the images: {error}"
            else:
                explained = "the predicted classes" if self.target is None else "the target"
                self.status.value = f"{len(self.images)} images, {explained} explained"
                return evaluation_bars(table, per_row=self._per_row(EVALUATION_PANEL_PX, 4))
        if self.view.value == "ROAD curves":
            curves = self.road_curves(i)
            if self.method.value != "all" and self.method.value in curves:
                curves = {self.method.value: curves[self.method.value]}
            self.status.value = f"image {i}: {', '.join(curves)}"
            return curve_comparison(curves)
        if self.view.value == "sanity check":
            method = self.method.value if self.method.value != "all" else self.methods[0]
            try:
                result = self.sanity(i, method)
            except ValueError as error:  # the method does not apply to this model
                refused = f"; no sanity check of {method}: {error}"
            else:
                self.status.value = f"{method}: the model's layers randomized from the top"
                per_row = self._per_row(SANITY_PANEL_PX, 5, COLORBAR_PX)
                return sanity_maps(result, self.display[i : i + 1], 0, per_row)
        table = self.table(i)
        seconds = sum(s for s in table.seconds if not math.isnan(s))
        steps = table.options["steps"]
        self.status.value = f"image {i} scored in {seconds:.1f} s ({steps}-step curves){refused}"
        chosen = self.method.value
        if chosen != "all" and chosen not in table.results:
            self.status.value += f"; {chosen} skipped: {table.notes.get(chosen, '')}"
            chosen = "all"
        title = f"Saliency methods on image {i}" if chosen == "all" else f"{chosen} on image {i}"
        methods = None if chosen == "all" else [chosen]
        return side_by_side(table, self.display[i : i + 1], 0, title, methods)


def _resolve_names(model: nn.Module, methods: str | Sequence[str]) -> list[str]:
    """The method names ``methods`` stands for ("all", "default" or names)."""
    if methods not in ("all", "default"):
        return list(methods)
    from ..analysis import self_attention_names
    from ..hooks import HookedModel
    from ..methods.registry import selected_methods

    return selected_methods(methods, bool(self_attention_names(HookedModel(model))))
