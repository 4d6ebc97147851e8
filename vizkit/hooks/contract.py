"""How every analysis, metric and explorer runs a model: the model unwrapped and wrapped in a
`HookedModel`, held for one call at a time, in eval mode.

The eval-mode policy: an analysis runs the model with every module in eval mode (dropout and
drop-path off, BatchNorm on its running statistics), whatever mode it was given in, and restores
each module's training flag afterwards, also after an exception. A timm model is created in train
mode; its attention maps, Grad-CAM and CKA would otherwise be random. `HookedModel`'s own
``hooks`` and ``run_with_cache`` run the model as it is (they are the tool for studying a model in
training) and warn once when that mode makes results random or changes BatchNorm statistics.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from torch import nn

from .guard import exclusive
from .hooked_model import HookedModel
from .inputs import unwrap_model
from .scores import require_class_logits, require_classifier
from .video import VIDEO_ANALYSES, running

__all__ = ["analysis_contract", "as_hooked", "eval_mode", "held"]

P = ParamSpec("P")
R = TypeVar("R")


def as_hooked(model: nn.Module | HookedModel) -> HookedModel:
    """``model`` itself if it is a HookedModel, else a HookedModel around the unwrapped model."""
    return model if isinstance(model, HookedModel) else HookedModel(unwrap_model(model))


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the context; every module's training flag is restored on
    exit, also after an exception."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, mode in modes:
            module.training = mode


@contextmanager
def held(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` held by this thread (`vizkit.hooks.guard.exclusive`) and in eval mode."""
    with exclusive(model), eval_mode(model):
        yield model


# models whose forward does not take (B, C, H, W) images as they are, and what does
_PATCH_INPUTS = {
    **{
        name: f"{name} takes its images as patches with their spatial shapes and mask (NaFlex), "
        "not as (B, C, H, W) images: vk.models.Siglip2Images(model) makes them from images as "
        "its image processor does, and every analysis takes that."
        for name in ("Siglip2VisionModel", "Siglip2Model", "Siglip2ForImageClassification")
    },
    "ViTMAEModel": "ViTMAEModel masks a random 75 % of the patches and shuffles the rest on "
    "every forward (its pre-training), so no token sits on a known grid: "
    "vk.models.unmasked_mae(model) runs it on every patch in raster order, and every analysis "
    "takes that.",
}


def require_image_model(model: nn.Module) -> None:
    """Refuse a model whose forward needs text as well as images (a transformers ``CLIPModel``
    or ``SiglipModel``), patches instead of images (SigLIP 2) or masks its input at random
    (ViTMAE), naming the wrapper that explains it."""
    model = unwrap_model(model)
    name = type(model).__name__
    if name in _PATCH_INPUTS:
        raise TypeError(_PATCH_INPUTS[name])
    both = all(
        callable(getattr(model, f, None)) for f in ("get_image_features", "get_text_features")
    )
    if both and not callable(getattr(model, "encode_image", None)):
        raise TypeError(
            f"{name}'s forward needs text as well as images, so vizkit cannot run it on images "
            f"alone. Explain its image tower: vk.models.image_tower(model) returns its image "
            "embeddings (B, D), with target=vk.targets.text(model, 'a photo of a dog', "
            "tokenizer=tokenizer); or vk.models.zero_shot(model, text_embeddings) makes the "
            "prompts classes for integer targets."
        )


def analysis_contract(
    fn: Callable[P, R] | None = None, *, classifier: str | None = None, videos: bool = False
) -> Callable[P, R]:
    """Run ``fn(model, ...)`` under the contract: ``model`` becomes a `HookedModel` (wrappers
    unwrapped), held by this thread for the call (`vizkit.hooks.guard.exclusive`) and in eval
    mode. A class target on a backbone is refused; ``classifier`` (what ``fn`` reads through
    the classifier head, e.g. "the logit lens reads each layer's stream through it") refuses a
    backbone whatever the target. ``videos``: ``fn`` takes a video model's clips (its results
    carry the frame axis); a video model is refused otherwise (`vizkit.hooks.video`)."""
    if fn is None:
        return functools.partial(analysis_contract, classifier=classifier, videos=videos)
    signature = inspect.signature(fn)
    targeted = "target" in signature.parameters
    if videos:
        VIDEO_ANALYSES.add(fn.__name__)

    @functools.wraps(fn)
    def run(model: nn.Module | HookedModel, *args: P.args, **kwargs: P.kwargs) -> R:
        require_image_model(model.model if isinstance(model, HookedModel) else model)
        hm = as_hooked(model)
        if classifier is not None:
            require_classifier(hm.model, classifier)
        if targeted:
            bound = signature.bind_partial(hm, *args, **kwargs)
            target = bound.arguments.get("target", signature.parameters["target"].default)
            require_class_logits(hm.model, target)
        with held(hm.model), running(fn.__name__, videos):
            return fn(hm, *args, **kwargs)

    return run
