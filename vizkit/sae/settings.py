"""`TrainingSettings`: what a `train_sae` run is, saved in its checkpoint and compared field by
field on resume; every field is range-checked when the settings are made, before any row is
read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..hooks.inputs import check_count, check_number
from ..runs.settings import Settings
from .median import geometric_median

__all__ = ["B_DEC_STARTS", "TrainingSettings"]

# where the decoder bias starts: name -> rows (n, width) -> (width,)
B_DEC_STARTS = {"median": geometric_median, "mean": lambda rows: rows.mean(0),
                "zeros": lambda rows: torch.zeros_like(rows[0])}  # fmt: skip


@dataclass(frozen=True)
class TrainingSettings(Settings):
    """The settings of one `train_sae` run (Gao et al. 2024, "Scaling and evaluating sparse
    autoencoders", Sec. 2 and A).

    Attributes:
        kind: "topk", "batchtopk", "relu" or "matryoshka".
        latents: the dictionary size.
        k: latents kept per row (None for "relu").
        l1: the L1 coefficient of "relu" (None for the other kinds).
        prefixes: the nested dictionary sizes of "matryoshka" (None for the other kinds).
        tokens: rows trained on (steps = tokens // batch_size).
        batch_size: rows per step.
        lr: Adam's peak learning rate, > 0.
        warmup: the fraction of the steps the learning rate rises over, in [0, 1].
        decay: the fraction it falls to 0 over at the end, in [0, 1 - warmup].
        aux_k: AuxK's latents (0: off).
        aux_coefficient: AuxK's weight, >= 0.
        dead_after: rows without firing after which a latent counts as dead, >= 1.
        b_dec: where the decoder bias starts: "median", "mean" or "zeros".
        block_bytes: bytes of consecutive rows read and shuffled at a time.
        seed: the initialization's and the row order's seed.
        source: the rows' origin (store, layer, tokens, model), as `rows_source` gives it.
    """

    kind: str
    latents: int
    k: int | None
    l1: float | None
    prefixes: tuple[int, ...] | None
    tokens: int
    batch_size: int
    lr: float
    warmup: float
    decay: float
    aux_k: int
    aux_coefficient: float
    dead_after: int
    b_dec: str
    block_bytes: int
    seed: int
    source: dict[str, Any]

    def __post_init__(self) -> None:
        check_count("latents", self.latents)
        check_count("tokens", self.tokens)
        check_count("batch_size", self.batch_size)
        if self.tokens < self.batch_size:
            raise ValueError(
                f"tokens={self.tokens} is less than one batch ({self.batch_size} rows); pass "
                f"tokens >= batch_size or a smaller batch_size."
            )
        valid_k = isinstance(self.k, int) and not isinstance(self.k, bool)
        if self.kind != "relu" and not (valid_k and 1 <= self.k <= self.latents):
            raise ValueError(
                f"kind={self.kind!r} needs k, an int in 1..{self.latents}; got {self.k!r}."
            )
        if self.l1 is not None:
            check_number("l1", self.l1, 0)
        check_number("lr", self.lr, 0, low_open=True)
        check_number("warmup", self.warmup, 0, 1)
        check_number("decay", self.decay, 0, 1)
        if self.warmup + self.decay > 1:
            raise ValueError(
                f"warmup + decay must be at most 1 (fractions of the run's steps); got "
                f"{self.warmup} + {self.decay}."
            )
        check_count("aux_k", self.aux_k, 0, self.latents)
        check_number("aux_coefficient", self.aux_coefficient, 0)
        check_count("dead_after", self.dead_after)
        if self.b_dec not in B_DEC_STARTS:
            raise ValueError(f"b_dec must be one of {', '.join(B_DEC_STARTS)}; got {self.b_dec!r}.")
        check_count("block_bytes", self.block_bytes)
        check_count("seed", self.seed, 0)

    @property
    def steps(self) -> int:
        """The optimizer steps of the run."""
        return self.tokens // self.batch_size

    def learning_rate_factor(self, step: int) -> float:
        """The learning rate's factor at ``step``: a linear rise over the first ``warmup`` of
        the steps, 1, then a linear fall to 0 over the last ``decay``."""
        warm, cool = self.warmup * self.steps, self.decay * self.steps
        if warm > 0 and step < warm:
            return (step + 1) / warm
        if cool > 0 and step >= self.steps - cool:
            return max(0.0, (self.steps - step) / cool)
        return 1.0
