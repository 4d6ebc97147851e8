"""SoT's head from the inside (Xie et al. 2022, § 3.2, Table 1, Fig. S-4): the anatomy of MGCrP on a
batch, the ClassT and WordT branches' predictions, Grad-CAM of one branch, and the exact share of
each word token in the WordT logit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from ...analysis.result import Result
from ...analysis.saliency_result import SaliencyResult
from ...hooks import HookedModel, Target, TokenLayout
from ...hooks.contract import analysis_contract, as_hooked
from ...hooks.inputs import check_images
from ...hooks.scores import target_indices
from ...methods.gradcam import gradcam
from .classification_head import SoTHead
from .power_normalization import SVPN_EPS
from .sot_pooling import MGCrP

__all__ = ["BranchPredictions", "HeadAnatomy", "branch", "branch_gradcam", "branch_predictions",
           "fig_s4_panels", "head_anatomy", "sot_head", "wordt_token_map"]  # fmt: skip


def sot_head(model: nn.Module | HookedModel) -> SoTHead:
    """The model's `SoTHead` (``model.head``); a ValueError for any other head."""
    net = model.model if isinstance(model, HookedModel) else model
    head = getattr(net, "head", None)
    if not isinstance(head, SoTHead):
        raise ValueError(
            f"{type(net).__name__}.head is {type(head).__name__}, not a SoTHead; build a "
            "vizkit_sot_* model or call vizkit.papers.sot.with_sot_head(model)."
        )
    return head


def _mgcrp(head: SoTHead) -> MGCrP:
    if not isinstance(head.pool, MGCrP):
        raise ValueError(
            f"This needs an MGCrP pool; the head (fusion {head.fusion!r}) has "
            f"{type(head.pool).__name__}."
        )
    return head.pool


@dataclass(repr=False)
class HeadAnatomy(Result):
    """One batch through the head: tokens -> per-head cross-covariance -> spectra -> logits.

    Attributes:
        tokens: (B, N, p) the head's input. cov: (B, h, m, n) the Q_i.
        singular_values: (B, h, k) of each Q_i (exact, k = min(m, n)).
        normalized_values: (B, h, k) after the model's normalization.
        lambda_hat: (B, h, r) the approximation's estimates (None for other norms).
        classt_logits, wordt_logits: (B, C) or None. logits: (B, C) the model's output.
        alpha, norm: the pool's settings (also ``options``).
        layout, image_size: the model's tokens and (H, W) of the input.
    """

    tokens: Tensor
    cov: Tensor
    singular_values: Tensor
    normalized_values: Tensor
    lambda_hat: Tensor | None
    classt_logits: Tensor | None
    wordt_logits: Tensor | None
    logits: Tensor
    alpha: float
    norm: str
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    @property
    def options(self) -> dict:
        return {"alpha": self.alpha, "norm": self.norm}

    def svpn_values(self, alpha: float) -> Tensor:
        """(B, h, k) singular values after exact svPN with ``alpha``: lambda^alpha (eq. 5)."""
        return self.singular_values.clamp_min(SVPN_EPS).pow(alpha)

    def approx_values(self, alpha: float) -> Tensor:
        """(B, h, k) after the one-value approximation with ``alpha``: lambda / lambda_hat_1^(1 -
        alpha) (eq. 8, r = 1; the ratios of the spectrum stay as they were). lambda_hat is the
        model's estimate, or the exact lambda_1 when the model does not use the approximation."""
        lam = self.lambda_hat if self.lambda_hat is not None else self.singular_values[..., :1]
        return self.singular_values / (lam[..., :1].pow(1.0 - alpha) + SVPN_EPS)


@analysis_contract
def head_anatomy(model: nn.Module | HookedModel, x: Tensor) -> HeadAnatomy:
    """Run a batch (B, C, H, W) and collect `HeadAnatomy` (eval mode, no gradients)."""
    hm = as_hooked(model)
    head = sot_head(hm)
    pool = _mgcrp(head)
    names = ["head.hook_tokens", "head.pool.hook_cov", "head.pool.hook_sv",
             "head.pool.hook_sv_normalized"]  # fmt: skip
    branches = {"classt": "head.hook_classt_logits", "wordt": "head.hook_wordt_logits"}
    present = {k: v for k, v in branches.items() if head.has_branch(k)}
    names += list(present.values())
    x = check_images(hm.model, x)
    with torch.no_grad():
        logits, cache = hm.run_with_cache(x, names=names)
        _, lam = pool.normalize(cache["head.pool.hook_cov"])
    return HeadAnatomy(
        tokens=cache["head.hook_tokens"], cov=cache["head.pool.hook_cov"],
        singular_values=cache["head.pool.hook_sv"],
        normalized_values=cache["head.pool.hook_sv_normalized"], lambda_hat=lam,
        classt_logits=cache[present["classt"]] if "classt" in present else None,
        wordt_logits=cache[present["wordt"]] if "wordt" in present else None,
        logits=logits, alpha=pool.alpha, norm=pool.norm,
        layout=hm.token_layout(tuple(x.shape[-2:])), image_size=tuple(x.shape[-2:]),
    )  # fmt: skip


@contextmanager
def branch(model: nn.Module | HookedModel, name: str) -> Iterator[nn.Module]:
    """Within the block the model returns one branch's logits ("classt" or "wordt")."""
    with sot_head(model).branch(name):
        yield model


@analysis_contract
def branch_gradcam(
    model: nn.Module | HookedModel, x: Tensor, name: str, target: Target = None
) -> SaliencyResult:
    """Grad-CAM (B, gh, gw) of one branch's logit (Fig. S-4 per branch), read at the last block's
    input, where both branches see the patch tokens (the ClassT logit reads only token 0 after
    the last block). ``target``: class index(es), or None for the branch's own argmax."""
    hm = as_hooked(model)
    layer = f"blocks.{len(hm.model.blocks) - 1}.hook_resid_pre"
    with branch(hm, name):
        result = gradcam(hm, x, target, layer=layer)
    result.method = f"gradcam_{name}"
    result.options["branch"] = name
    return result


@analysis_contract
def wordt_token_map(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None
) -> SaliencyResult:
    """The exact share of each word token in the WordT logit of ``target`` (default: the model's
    prediction), on the patch grid (B, gh, gw); signed (see `SoTHead.wordt_contributions`).
    ``extras["contributions"]`` holds all classes (B, q, C) and ``extras["bias"]`` (C,)."""
    hm = as_hooked(model)
    head = sot_head(hm)
    with torch.no_grad():
        logits, cache = hm.run_with_cache(check_images(hm.model, x), names="head.hook_tokens")
        contributions = head.wordt_contributions(cache["head.hook_tokens"])
    classes = target_indices(logits, target)
    chosen = contributions.gather(2, classes[:, None, None].expand(-1, contributions.shape[1], 1))
    layout = hm.token_layout(tuple(x.shape[-2:]), "head.hook_tokens")
    if layout is None:
        raise ValueError("The model has no patch grid to place the word tokens on.")
    maps = layout.to_grid(chosen[..., 0])
    has_bias = hasattr(head, "fc_word")  # "concat" keeps its bias with ClassT
    bias = head.fc_word.bias if has_bias else contributions.new_zeros(contributions.shape[-1])
    return SaliencyResult(
        maps=maps.float(), method="wordt_tokens", image_size=tuple(x.shape[-2:]),
        layout=layout, targets=classes,
        extras={"contributions": contributions, "bias": bias.detach()},
    )  # fmt: skip


@dataclass(repr=False)
class BranchPredictions(Result):
    """Logits over a dataset: ``labels`` (n,), ``logits`` (n, C) the model's output, and
    ``classt`` / ``wordt`` (n, C) its branches (None where absent); ``image_size`` (H, W) of
    the images."""

    labels: Tensor
    logits: Tensor
    classt: Tensor | None
    wordt: Tensor | None
    image_size: tuple[int, int] | None = None

    def rows(self) -> list[dict]:
        """Accuracy of the output and of each branch present."""
        present = [b for b in ("logits", "classt", "wordt") if getattr(self, b) is not None]
        return [{"output": b, "accuracy": self.accuracy(b)} for b in present]

    def correct(self, which: str = "logits") -> Tensor:
        """(n,) bool: "logits", "classt" or "wordt" predicts the label."""
        if which not in ("logits", "classt", "wordt"):
            raise ValueError(f"which must be 'logits', 'classt' or 'wordt'; got {which!r}.")
        values = getattr(self, which)
        if values is None:
            raise ValueError(f"No {which} logits here (the head has no such branch).")
        return values.argmax(1) == self.labels

    def accuracy(self, which: str = "logits") -> float:
        return self.correct(which).float().mean().item()


@analysis_contract
def branch_predictions(
    model: nn.Module | HookedModel, data: Dataset, batch_size: int = 500
) -> BranchPredictions:
    """The model's and, for a SoT head, its branches' logits on every item of a map-style dataset
    of (image, label, ...) items (eval mode); any classifier works (branches then None)."""
    hm = as_hooked(model)
    head = getattr(hm.model, "head", None)
    names = [f"head.hook_{b}_logits" for b in ("classt", "wordt")
             if isinstance(head, SoTHead) and head.has_branch(b)]  # fmt: skip
    parts: dict[str, list[Tensor]] = {"labels": [], "logits": [], "classt": [], "wordt": []}
    with torch.no_grad():
        for images, labels, *_ in DataLoader(data, batch_size=batch_size):
            x = check_images(hm.model, images)
            if names:
                logits, cache = hm.run_with_cache(x, names=names, device="cpu")
            else:
                logits, cache = hm.model(x), {}
            parts["labels"].append(labels)
            parts["logits"].append(logits.cpu())
            for b in ("classt", "wordt"):
                if f"head.hook_{b}_logits" in names:
                    parts[b].append(cache[f"head.hook_{b}_logits"])
    joined = {k: torch.cat(v) if v else None for k, v in parts.items()}
    return BranchPredictions(**joined, image_size=tuple(x.shape[-2:]))


def fig_s4_panels(classt: Tensor, wordt: Tensor, both: Tensor) -> dict[str, Tensor]:
    """Fig. S-4's panels: among the samples the ClassT+WordT model gets right, the indices where
    "classt_only" (ClassT right, WordT wrong), "wordt_only", "neither" and "both" are right.

    Args:
        classt, wordt, both: (n,) bool, each model's (or branch's) correctness.
    """
    if not classt.shape == wordt.shape == both.shape or classt.ndim != 1:
        raise ValueError(
            f"Need three (n,) bool vectors; got {tuple(classt.shape)}, {tuple(wordt.shape)}, "
            f"{tuple(both.shape)}."
        )
    cells = {"classt_only": classt & ~wordt, "wordt_only": ~classt & wordt,
             "neither": ~classt & ~wordt, "both": classt & wordt}  # fmt: skip
    return {k: (v & both).nonzero()[:, 0] for k, v in cells.items()}
