"""`compare_saliency`: run several saliency methods on one batch and score them side by side."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis._model import self_attention_names
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice, check_images
from ..hooks.scores import is_score_target, target_indices, target_label
from ..methods.registry import METHODS, registered, selected_methods
from .chance import certainty
from .faithfulness import LEVELS, CurveScoring, batch_images, curve_steps, unit_count
from .localization import check_masks, mask_shape
from .registry import selected_metrics
from .scoring import curve_ends, curve_images, keyed_notes, score_methods
from .table import SaliencyTable

__all__ = ["compare_saliency", "resolve_methods"]

Method = Callable[[HookedModel, Tensor, Tensor], SaliencyResult]


@analysis_contract(videos=True)
def compare_saliency(
    model: nn.Module | HookedModel,
    x: Tensor,
    methods: str | Sequence[str | tuple[str, Method]] = "default",
    masks: Tensor | None = None,
    target: Target = None,
    level: str = "patch",
    steps: int | None = None,
    progress: bool = True,
    metrics: str | Sequence[str] = "quick",
) -> SaliencyTable:
    """Score saliency methods on one batch, by default by deletion and insertion AUC, and
    with ``masks`` the pointing game, energy in the mask and IoU of the top region.

    Args:
        model: any model (wrappers unwrapped), run in eval mode, its training flags restored.
        x: (B, C, H, W) images, B >= 1, finite; a video model's clips (B, T, C, H, W) (the
            metrics that take clips are scored, `vizkit.metrics.METRICS`' ``videos``).
        methods: distinct names from `vizkit.methods.METHODS` or ``(name, fn(hm, x, targets)
            -> SaliencyResult)``, at least one; "all": every registered method (those that do
            not apply to the model are noted and left unscored); "default" (the default): the
            registry's defaults (`vizkit.methods.default_methods`), the report's.
        masks: (B, H, W) bool (or 0/1) object masks of the images, each with an object pixel;
            of clips, (B, T, H, W) masks of every frame.
        target: the class every method explains (default: the model's prediction), or a
            score target (`vizkit.targets`, a callable): the curves then track its score.
        level: unit of the deletion/insertion curves, "patch" or "pixel".
        steps: steps of each deletion/insertion curve, in [1, units]; None: min(16, units).
            Each step is a forward pass of every image for every method and curve, so the
            cost grows with it: ``steps=64`` gives finer AUCs at 4x.
        progress: show a progress bar over the perturbed images (tqdm, notebook-aware).
        metrics: names of `vizkit.metrics.METRICS`; "quick" (the default): those marked quick
            that apply; "all": every one that applies (as `evaluate` scores a data set).

    Every input is checked before any method runs. A method that raises ValueError for this
    model (e.g. class attention without a class token), or whose maps do not fit the images or
    hold NaN / Inf, gets a NaN row and a warning; the reason is kept in ``notes``. Images whose
    prediction is near chance (`vizkit.metrics.near_chance`) are named in a warning and in
    the table (``near_chance``, `SaliencyTable.caution`).
    """
    x = check_images(model.model, x)
    chosen = resolve_methods(methods, model)
    check_choice("level", level, LEVELS)
    steps = curve_steps(steps, unit_count(model.model, tuple(x.shape[-2:]), level), level)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False; got {progress!r}.")
    if masks is not None:
        masks = _masks_for(masks, x)
    scoring = CurveScoring.of(target)
    names = selected_metrics(metrics, masks is not None, scoring.score is not None, x.ndim == 5)
    ends = curve_ends(model, x, names, scoring, batch_images(None, x, model.model))
    logits = ends.logits
    targets = target if scoring.score is not None else target_indices(logits, target)
    per_image, seconds, notes, results = [], [], {}, {}
    share = curve_images(names, len(x), steps)  # perturbed images per method
    with tqdm(total=share * len(chosen), desc="compare_saliency", unit="image",
              disable=not progress, leave=False) as bar:  # fmt: skip
        scored = score_methods(model, x, targets, masks, chosen, names, level, steps, ends, bar)
        bar.set_postfix_str(chosen[0][0])
        for i, (name, method) in enumerate(scored):
            bar.update(share * (i + 1) - bar.n)  # what constant or skipped maps left unrun
            per_image.append(method.scores)
            seconds.append(method.seconds)
            if method.result is not None:
                results[name] = method.result
            notes |= keyed_notes(name, method.notes)
            for kind, note in method.notes.items():
                said = {"method": f"{name} skipped: {note}", "constant maps": f"{name}: {note}.",
                        "no object": f"{name}: {note}."}  # fmt: skip
                said = said.get(kind, f"{name}: {kind}: {note}.")
                warnings.warn(f"compare_saliency: {said}", stacklevel=3)
            if i + 1 < len(chosen):
                bar.set_postfix_str(chosen[i + 1][0])
    image_size = tuple(x.shape[-2:])
    chance = {} if scoring.score is not None else certainty(logits, targets)
    table = SaliencyTable(
        [name for name, _ in chosen], names, torch.stack(per_image), seconds, notes,
        options={"level": level, "steps": steps, **_scored(target)}, results=results,
        layout=model.token_layout(image_size), image_size=image_size, **chance,
    )  # fmt: skip
    if table.caution():
        warnings.warn(f"compare_saliency: {table.caution()}", stacklevel=3)
    return table


def _scored(target: Target) -> dict:
    """The table's note of what the curves scored: a score target's label (none for classes)."""
    if not is_score_target(target):
        return {}
    return {"score": target_label(target)}


def _masks_for(masks: Tensor, x: Tensor) -> Tensor:
    """``masks`` checked (`check_masks`) as bool (B, H, W) matching images x (B, C, H, W), or
    (B, T, H, W) matching clips x (B, T, C, H, W)."""
    masks = check_masks(masks)
    expected, axes = mask_shape(x)
    if tuple(masks.shape) != expected:
        raise ValueError(
            f"masks must be {axes} = {expected} to match the images; got "
            f"{tuple(masks.shape)}. Pass one mask per image (per frame of a clip), at the "
            "images' size."
        )
    return masks.to(x.device)


def resolve_methods(
    methods: str | Sequence[str | tuple[str, Method]], hm: HookedModel
) -> list[tuple[str, Method]]:
    """(name, fn) of each method: names looked up in `vizkit.methods.METHODS`, "all" for
    every registered method, "default" for `default_methods`; distinct names, at least one."""
    if methods in ("all", "default"):
        methods = selected_methods(methods, bool(self_attention_names(hm)))
    if isinstance(methods, str):  # one method's name
        methods = [methods]
    if not isinstance(methods, Sequence):
        raise TypeError(
            f"methods must be a name, a list of names or (name, fn) pairs, 'all' or "
            f"'default'; got {methods!r}."
        )
    if not methods:
        known = ", ".join(METHODS)
        raise ValueError(f"methods is empty; pass at least one of {known}.")
    chosen = [(m, registered(m)) if isinstance(m, str) else _pair(m) for m in methods]
    names = [name for name, _ in chosen]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"Method names must be distinct; {repeated} appear more than once.")
    return chosen


def _pair(method: object) -> tuple[str, Method]:
    """A custom ``(name, fn)`` method, checked."""
    if (
        not isinstance(method, tuple)
        or len(method) != 2
        or not isinstance(method[0], str)
        or not callable(method[1])
    ):
        raise TypeError(
            "A method must be a name from vizkit.methods.METHODS or a (name, fn(hm, x, "
            f"targets) -> SaliencyResult) pair; got {method!r}."
        )
    return method
