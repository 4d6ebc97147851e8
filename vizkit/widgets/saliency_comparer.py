"""SaliencyComparer: saliency methods side by side on a chosen image, with their scores."""

from __future__ import annotations

import math
from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from torch import Tensor, nn

from ..hooks import Target
from ..hooks.inputs import check_images, video_input
from ..hooks.scores import is_score_target, model_logits, require_class_logits, select_images
from ..hooks.video import running
from ..metrics import compare_saliency, evaluate, road, sanity_check
from ..viz import display_images
from ..viz.evaluation import curve_comparison, evaluation_bars
from ..viz.fit import COLORBAR_PX
from ..viz.saliency import PANELS_PER_ROW, side_by_side
from ..viz.sanity import sanity_maps
from .clip_saliency import NO_SCORES, clip_maps, clip_methods, clips_figure, frame_figure
from .explorer import Explorer
from .redraw import PLOTLY_WIDTH

__all__ = ["SaliencyComparer"]

VIEWS = ["maps", "ROAD curves", "sanity check", "all images"]
# the narrowest panels at the figure's width: a metric's bars (a title such as
# "relevance_mass_accuracy ↑" at 12 px), a sanity map (its title's longest word)
EVALUATION_PANEL_PX, SANITY_PANEL_PX = 175, 85
CLIP_PANEL_PX = 150  # a clip's frame with a method's map, its title's name on one line


class SaliencyComparer(Explorer):
    """Saliency methods on one image at a time: maps side by side, each image's deletion and
    insertion AUC (and, with ``masks``, pointing game, energy in the mask, IoU) in the titles,
    and a warning in the title where the prediction is near chance. Each image is scored on its
    first visit, with a progress bar (and a line beside the slider saying what is being scored,
    then what it cost), and cached; revisiting only redraws.

    A video model's clips (B, T, C, H, W) get a "frame" slider instead of the view buttons:
    the methods that take clips map the clip once, each map min-max scaled over the whole clip
    (so frames compare), drawn over the chosen frame (a token frame's map over each frame of its
    tubelet), with each frame's share of the clip's |map| in the panel titles; the static copy
    shows every frame side by side, a row per method. The metrics do not take clips yet, so
    there are no scores, ROAD curves, sanity checks or evaluation (the status line says so).

    Args:
        images: (B, C, H, W) normalized for the model (a video model's clips (B, T, C, H, W));
            masks: (B, H, W) bool object masks (images only).
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
        self.video = video_input(model) is not None
        with running(type(self).__name__, videos=True):  # each method says if it takes clips
            self.model, self.images = model, check_images(model, images)
        require_class_logits(model, target)
        self.target = torch.as_tensor(target) if isinstance(target, list | tuple) else target
        if self.video and masks is not None:
            raise ValueError(
                "The comparer shows a video model's maps frame by frame and scores no clip: "
                "leave masks out here, and score the clips' maps against their masks "
                "(B, T, H, W) with vk.metrics.compare_saliency(model, clips, masks=masks)."
            )
        if masks is not None and tuple(masks.shape) != (len(images), *images.shape[-2:]):
            raise ValueError(
                f"masks must be (B, H, W) = ({len(images)}, {images.shape[-2]}, "
                f"{images.shape[-1]}) to match the images; got {tuple(masks.shape)}."
            )
        self.masks = masks
        self.methods = _resolve_names(model, methods)
        if self.video:
            self.methods = clip_methods(self.methods, methods not in ("all", "default"))
        self.display = display_images(images, model, mean, std)  # (B, [T,] H, W, 3)
        self.steps, self.progress = steps, progress
        self.image = widgets.IntSlider(
            0, 0, len(images) - 1, description="clip" if self.video else "image"
        )
        self.method = widgets.Dropdown(options=["all", *self.methods], description="method")
        self.view = widgets.ToggleButtons(options=VIEWS, description="view")
        self.status = widgets.Label()  # what scoring is under way, or what it cost
        # a clip: a frame slider; the views other than "maps" score, so none but it is offered
        self.frame = widgets.IntSlider(0, 0, images.shape[1] - 1, description="frame") if (
            self.video) else None  # fmt: skip
        chosen = [self.frame, self.method] if self.video else [self.method, self.view]
        if self.video:  # a row of its own: what a clip's view leaves out, and any skipped
            self.status.layout.grid_area = "auto / 1 / auto / -1"
        self.controls = [self.image, *chosen, self.status]
        self._observe(self.image, *chosen)
        self.refresh()

    def clip_maps(self, clip: int) -> tuple[dict, dict[str, str]]:
        """A video model's clip ``clip``: each method's `SaliencyResult`, and why the methods
        left out could not run (computed on first use)."""

        def run():
            self.status.value = f"computing {len(self.methods)} methods' maps of clip {clip}…"
            x = self.images[clip : clip + 1]
            return clip_maps(self.model, x, self.methods, self._target_of(clip))

        return self.cached((clip, "clip"), run)

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

    def _shown_maps(self) -> tuple[dict, str]:
        """A clip's maps of the method chosen (or all), and the title over them."""
        i, chosen = self.image.value, self.method.value
        results, notes = self.clip_maps(i)
        self.status.value = NO_SCORES
        if chosen != "all" and chosen not in results:
            self.status.value += f"; {chosen} skipped: {notes.get(chosen, '')}"
            chosen = "all"
        elif chosen == "all" and notes:
            self.status.value += f"; skipped: {', '.join(notes)}"
        if not results:
            raise ValueError(f"No method could map clip {i}: {notes}")
        what = "Saliency methods" if chosen == "all" else chosen
        return (results if chosen == "all" else {chosen: results[chosen]}), f"{what} on clip {i}"

    def _static_figure(self) -> go.Figure:
        """A clip's frames side by side, a row per method; an image's view as the widget."""
        if not self.video:
            return self.figure
        results, title = self._shown_maps()
        return clips_figure(self.display[self.image.value], results, title)

    def _figure(self) -> go.Figure:
        i = self.image.value
        if self.video:
            results, title = self._shown_maps()
            frame, count = self.frame.value, self.images.shape[1]
            title += f", frame {frame} of {count}"
            per_row = self._per_row(CLIP_PANEL_PX, PANELS_PER_ROW)
            return frame_figure(self.display[i], results, frame, title, per_row)
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
