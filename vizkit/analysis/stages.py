"""Results of a model whose layers hold different tokens (the stages of a hierarchical model, a
class token that joins late): one result per token layout, in forward order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from torch import Tensor

from ..hooks import HookedModel
from .result import Result

__all__ = ["Stages", "layout_runs"]


@dataclass(repr=False)
class Stages(Result):
    """One result per group of layers that share a token layout, in forward order.

    Attributes:
        stages: the results (e.g. `AttentionResult`s), each with its own ``layout``.
        image_size: (H, W) of the input.
        options: the call's resolved settings.

    Indexing, iteration and ``len`` go over the stages; ``layers`` and ``names`` list every
    stage's, in order.
    """

    stages: list
    image_size: tuple[int, int] | None = None
    options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("Stages needs at least one stage.")

    def __len__(self) -> int:
        return len(self.stages)

    def __iter__(self) -> Iterator:
        return iter(self.stages)

    def __getitem__(self, index: int):
        return self.stages[index]

    @property
    def layers(self) -> list:
        return [layer for stage in self.stages for layer in stage.layers]

    @property
    def names(self) -> list[str]:
        """Every stage's hook names (``names``, else ``layers`` where those are names)."""
        return [n for stage in self.stages for n in getattr(stage, "names", stage.layers)]

    def stage_of(self, layer) -> int:
        """Which stage holds ``layer`` (as the stages' ``layers`` list it)."""
        for index, stage in enumerate(self.stages):
            if layer in stage.layers:
                return index
        raise ValueError(f"Layer {layer!r} is in no stage; the stages hold {self.layers}.")

    def stats(self, *args, **kwargs) -> list[dict[str, Tensor]]:
        """Each stage's ``stats()`` (the heads may differ between stages)."""
        return [stage.stats(*args, **kwargs) for stage in self.stages]


def layout_runs(hm: HookedModel, names: list[str], image_size: tuple[int, int]) -> list[list[str]]:
    """``names`` in runs of consecutive layers that share a token layout, in forward order."""
    runs: list[list[str]] = []
    previous = None
    for name in names:
        layout = hm.token_layout(image_size, name)
        if layout != previous:
            runs.append([])
        runs[-1].append(name)
        previous = layout
    return runs
