"""The representatives of docs/coverage.md (one per timm family, one per family of another
library) as pytest parameters ``(make, size)``: a builder of the model, with random weights,
and the image side it takes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import timm
import torch
from torch import nn

from vizkit.hooks.inputs import video_input
from vizkit.hooks.scores import is_dense
from vizkit.models.representatives import FAMILIES, LIBRARIES


def representatives() -> list:
    """pytest params ``(make, size)`` with the family (or ``library:name``) as id."""
    reps = [
        pytest.param(lambda r=r: timm.create_model(r.model, **r.kwargs), r.size, id=family)
        for family, r in FAMILIES.items()
    ]
    for library, models in LIBRARIES.items():
        reps += [
            pytest.param(m.build, m.size, id=f"{library}:{name}") for name, m in models.items()
        ]
    return reps


def refuses_videos(model: nn.Module, call: Callable[[], object]) -> bool:
    """Whether ``model`` is a video model, after checking that ``call`` (an analysis that does
    not take videos yet) refuses it by name; False (nothing run) for a model of images."""
    if video_input(model) is None:
        return False
    with pytest.raises(ValueError, match=r"\(\) does not take videos yet.*Analyses that take"):
        call()
    return True


def refuses_class_scores(model: nn.Module, call: Callable[[], object]) -> bool:
    """Whether a class-scoring ``call`` cannot run on ``model``, after checking that it
    refuses it by name: a video model (`refuses_videos`) or a dense one (segmentation, depth:
    a class index names no score). False (nothing run) for a classifier of images."""
    if not is_dense(model):
        return refuses_videos(model, call)
    with pytest.raises(ValueError, match=r"returns a map per image.*vk\.targets\.segment"):
        call()
    return True


def drawn(make) -> nn.Module:
    """``make()`` seeded and in eval mode, with the weights timm starts at zero (a classifier
    head) drawn, so that gradients and relevance reach the input."""
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1 and not p.any():
                p.normal_(std=0.02)
    return model
