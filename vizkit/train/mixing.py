"""Mixup (Zhang et al. 2018) and CutMix (Yun et al. 2019) for the DeiT-style strong recipe: one of
the two per batch, half the time each when both are on, as timm's `Mixup`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["mix_batch", "mixed_cross_entropy"]


def _beta(alpha: float, generator: torch.Generator) -> float:
    """One draw of Beta(alpha, alpha), reproducible from ``generator``."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    gamma = torch.distributions.Gamma(torch.tensor(alpha), torch.tensor(1.0))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        a, b = gamma.sample(), gamma.sample()
    return float(a / (a + b))


def mix_batch(
    images: Tensor, labels: Tensor, mixup: float, cutmix: float, generator: torch.Generator
) -> tuple[Tensor, Tensor, float]:
    """Mix a batch (B, C, H, W) with a permutation of itself.

    Args:
        mixup, cutmix: Beta(alpha, alpha) parameters; 0 turns that kind off.

    Returns:
        the mixed images (B, C, H, W), the partner labels (B,) and lam, the weight of the
        original labels in the loss (the kept area for CutMix).
    """
    order = torch.randperm(len(images), generator=generator)
    use_cutmix = cutmix > 0 and (mixup <= 0 or torch.rand(1, generator=generator).item() < 0.5)
    lam = _beta(cutmix if use_cutmix else mixup, generator)
    if not use_cutmix:
        return lam * images + (1 - lam) * images[order], labels[order], lam
    h, w = images.shape[-2:]
    cut_h, cut_w = round(h * (1 - lam) ** 0.5), round(w * (1 - lam) ** 0.5)
    cy, cx = (torch.randint(0, n, (1,), generator=generator).item() for n in (h, w))
    y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h - cut_h // 2, h)
    x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w - cut_w // 2, w)
    mixed = images.clone()
    mixed[..., y0:y1, x0:x1] = images[order][..., y0:y1, x0:x1]
    return mixed, labels[order], 1 - (y1 - y0) * (x1 - x0) / (h * w)


def mixed_cross_entropy(
    logits: Tensor, labels: Tensor, partners: Tensor, lam: float, label_smoothing: float
) -> Tensor:
    """lam * CE(logits, labels) + (1 - lam) * CE(logits, partners), each label-smoothed."""
    ce = F.cross_entropy
    if lam == 1.0:
        return ce(logits, labels, label_smoothing=label_smoothing)
    return lam * ce(logits, labels, label_smoothing=label_smoothing) + (1 - lam) * ce(
        logits, partners, label_smoothing=label_smoothing
    )
