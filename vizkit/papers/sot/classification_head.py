"""SoT's classification head (SoT, Xie et al. 2022, § 3.2, Eq. 1, Fig. 2): the class token (ClassT)
and the pooled word tokens (WordT) fused into one classifier."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ...hooks.hook_point import HookPoint
from .sot_pooling import GlobalAveragePooling, GlobalCovariancePooling, MGCrP

__all__ = ["FUSIONS", "POOLS", "SoTHead", "make_pool"]

FUSIONS = ("classt", "wordt", "sum", "concat", "aggr_all", "late")
POOLS = ("mgcrp", "gcp", "gap")
LATE_RULES = ("paper", "code")
_USES_CLASS_TOKEN = ("classt", "sum", "concat", "late")


def make_pool(pool: str, dim: int, **kwargs) -> nn.Module:
    """A word-token pooling by name: "mgcrp" (`MGCrP` kwargs), "gcp" (``reduced``, ``num_iter``;
    the reduced size defaults to MGCrP's representation size rule for ``num_heads``/``m`` given)
    or "gap"."""
    if pool == "mgcrp":
        return MGCrP(dim, **kwargs)
    if pool == "gcp":
        heads, m = kwargs.pop("num_heads", 6), kwargs.pop("m", 14)
        kwargs.setdefault("reduced", GlobalCovariancePooling.size_for(heads, m))
        return GlobalCovariancePooling(dim, **kwargs)
    if pool == "gap":
        return GlobalAveragePooling(dim)
    raise ValueError(f"pool must be one of {POOLS}; got {pool!r}.")


def _linear(fan_in: int, num_classes: int) -> nn.Linear:
    """A classifier FC initialized as released: trunc-normal(0.02) weights, zero bias."""
    fc = nn.Linear(fan_in, num_classes)
    nn.init.trunc_normal_(fc.weight, std=0.02)
    nn.init.zeros_(fc.bias)
    return fc


class SoTHead(nn.Module):
    """Tokens (B, N, p) after the backbone's final norm -> logits (B, C).

    Args:
        dim: token size p. num_classes: C.
        fusion: "classt" (FC on the class token), "wordt" (FC on pooled word tokens), or eq. 1's
            "sum" (two FCs, logits added; the paper's choice), "concat" (one FC on
            [z0, pool(Z)]), "aggr_all" (FC on the pool of all tokens, class token included),
            "late" (two classifiers, predictions added).
        pool: "mgcrp", "gcp" or "gap" (Table 2); ``pool_kwargs`` go to it.
        num_prefix_tokens: P; the word tokens are tokens[:, P:], the class token tokens[:, 0].
        late: "paper" (the output is log((softmax(ClassT) + softmax(WordT)) / 2): its softmax is
            the paper's prediction halved, and cross-entropy on it trains that rule) or "code"
            (the logits added, the released evaluation rule).
        dropout: on the pooled word representation (Table S-2: 0 Tiny, 0.5 Small, 0.7 Base).

    HookPoints: ``hook_tokens`` (B, N, p) the input (a (B, H, W, p) map flattened);
    ``hook_classt_logits`` and ``hook_wordt_logits`` (B, C) the two branches (for "concat" the
    class token's and the pooled part's share of the one FC, the bias with ClassT; "aggr_all" has
    no branches). For "sum" and "concat" the output is their sum. ``with head.branch("wordt"):``
    makes the head return one branch (e.g. for Grad-CAM of one branch's logit).
    """

    reads_class_token = True  # its ClassT branch: analyses treat the class token as read

    def __init__(
        self,
        dim: int,
        num_classes: int,
        fusion: str = "sum",
        pool: str = "mgcrp",
        num_prefix_tokens: int = 1,
        late: str = "paper",
        dropout: float = 0.0,
        **pool_kwargs,
    ) -> None:
        super().__init__()
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}; got {fusion!r}.")
        if late not in LATE_RULES:
            raise ValueError(f"late must be one of {LATE_RULES}; got {late!r}.")
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1; got {num_classes}.")
        if fusion in _USES_CLASS_TOKEN and num_prefix_tokens < 1:
            raise ValueError(
                f"fusion {fusion!r} reads the class token, but the model has no prefix tokens; "
                "use fusion 'wordt' (as the paper does for Swin)."
            )
        self.fusion, self.late, self.num_prefix_tokens = fusion, late, num_prefix_tokens
        self.num_classes = num_classes
        self.pool = make_pool(pool, dim, **pool_kwargs) if fusion != "classt" else None
        pooled = self.pool.out_dim if self.pool is not None else 0
        if fusion in ("classt", "sum", "late"):
            self.fc_cls = _linear(dim, num_classes)
        if fusion in ("wordt", "sum", "late", "aggr_all"):
            self.fc_word = _linear(pooled, num_classes)
        if fusion == "concat":
            self.fc = _linear(dim + pooled, num_classes)
        self.drop = nn.Dropout(dropout)
        self.output = "fused"
        self.hook_tokens = HookPoint()
        self.hook_classt_logits = HookPoint()
        self.hook_wordt_logits = HookPoint()

    def extra_repr(self) -> str:
        return f"fusion={self.fusion!r}, num_prefix_tokens={self.num_prefix_tokens}"

    def word_tokens(self, tokens: Tensor) -> Tensor:
        """(B, N, p) -> the word tokens (B, q, p), q = N - P."""
        return tokens[:, self.num_prefix_tokens :]

    def branch_logits(self, tokens: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """(B, N, p) -> ClassT and WordT logits (B, C) each (None where the fusion has none)."""
        z0 = tokens[:, 0]
        if self.fusion == "aggr_all":
            return None, None
        pooled = self.drop(self.pool(self.word_tokens(tokens))) if self.pool is not None else None
        if self.fusion == "concat":
            w_cls, w_word = self.fc.weight.split([z0.shape[-1], pooled.shape[-1]], dim=1)
            return z0 @ w_cls.T + self.fc.bias, pooled @ w_word.T
        cls = self.fc_cls(z0) if hasattr(self, "fc_cls") else None
        word = self.fc_word(pooled) if pooled is not None else None
        return cls, word

    def forward(self, tokens: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens (B, N, p), or a (B, H, W, p) feature map without prefix tokens (Swin) ->
        logits (B, C); ``pre_logits`` (one-branch heads): the pooled features (B, D)."""
        if tokens.ndim == 4 and self.num_prefix_tokens == 0:
            tokens = tokens.flatten(1, 2)
        if tokens.ndim != 3 or tokens.shape[1] <= self.num_prefix_tokens:
            raise ValueError(
                f"SoTHead takes tokens (B, N, p) with N > {self.num_prefix_tokens} prefix tokens; "
                f"got shape {tuple(tokens.shape)}."
            )
        tokens = self.hook_tokens(tokens)
        if pre_logits:
            if self.fusion not in ("wordt", "aggr_all"):
                raise ValueError(
                    f"pre_logits needs one pooled branch; fusion {self.fusion!r} has two."
                )
            pooled = tokens if self.fusion == "aggr_all" else self.word_tokens(tokens)
            return self.drop(self.pool(pooled))
        if self.fusion == "aggr_all":
            return self.fc_word(self.drop(self.pool(tokens)))
        cls, word = self.branch_logits(tokens)
        cls = self.hook_classt_logits(cls) if cls is not None else None
        word = self.hook_wordt_logits(word) if word is not None else None
        if self.output != "fused":
            return cls if self.output == "classt" else word
        if cls is None or word is None:
            return cls if word is None else word
        if self.fusion == "late" and self.late == "paper":
            both = torch.stack([cls.log_softmax(-1), word.log_softmax(-1)])
            return both.logsumexp(0) - math.log(2.0)  # log of the mean of the two softmaxes
        return cls + word

    def has_branch(self, name: str) -> bool:
        """Whether the fusion has the branch "classt" or "wordt" ("aggr_all" has neither)."""
        if name not in ("classt", "wordt"):
            raise ValueError(f"branch must be 'classt' or 'wordt'; got {name!r}.")
        blocked = {"aggr_all", "wordt" if name == "classt" else "classt"}
        return self.fusion not in blocked

    @contextmanager
    def branch(self, name: str) -> Iterator[SoTHead]:
        """Within the block the head returns one branch's logits: "classt" or "wordt"."""
        if not self.has_branch(name):
            raise ValueError(f"The head's fusion {self.fusion!r} has no {name} branch.")
        previous, self.output = self.output, name
        try:
            yield self
        finally:
            self.output = previous

    def wordt_contributions(self, tokens: Tensor) -> Tensor:
        """The exact share of each word token in the WordT logits (SoT eqs. 3, 8), eval mode.

        With Q_i = (1/q) sum_t x_t y_t^T and a normalization that rescales each Q_i by c_i
        (none, or the adopted approximation with one singular value), the WordT logit of class c
        is b_c + sum_t s_tc with s_tc = (1/q) sum_i c_i x_ti^T A_ci y_ti (A_ci: the FC's weights
        for head i). The c_i are the image's own; no gradients involved.

        Args:
            tokens: (B, N, p) head input.

        Returns:
            (B, q, C); sum over q plus the WordT FC's bias (zero for "concat") = WordT logits.
        """
        if not isinstance(self.pool, MGCrP) or self.fusion == "aggr_all":
            raise ValueError(
                "Exact token contributions need an MGCrP pool and a WordT branch; this head has "
                f"pool {type(self.pool).__name__} and fusion {self.fusion!r}."
            )
        z = self.word_tokens(tokens)
        x, y = self.pool.projections(z)
        scale = self.pool.scale(self.pool.cross_covariance(x, y))
        if self.fusion == "concat":
            weight = self.fc.weight[:, tokens.shape[-1] :]
        else:
            weight = self.fc_word.weight
        blocks = weight.reshape(self.num_classes, self.pool.num_heads, self.pool.m, self.pool.n)
        return torch.einsum("bhtm,chmn,bhtn,bh->btc", x, blocks, y, scale) / z.shape[1]
