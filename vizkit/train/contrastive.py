"""Contrastive image-text training (Radford et al. 2021, "Learning Transferable Visual Models
From Natural Language Supervision", Sec. 2.3 and Fig. 3): each batch's images and captions
embedded, their cosine similarities scaled by the model's learned temperature, and the
cross-entropy of matching each image to its caption and each caption to its image, averaged.
`zero_shot_accuracy` classifies images by their nearest class prompt (Sec. 3.1.2)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..hooks.inputs import check_count, check_number
from ..models.zero_shot import zero_shot_predictions

__all__ = ["ContrastiveConfig", "contrastive_loss", "train_contrastive", "zero_shot_accuracy"]


@dataclass
class ContrastiveConfig:
    """epochs, batch_size, lr (AdamW, cosine decay after a linear warm-up of ``warmup_epochs``),
    weight_decay, seed, threads (torch's CPU threads); images: how many of the training split's
    images a recipe trains on (None: all)."""

    epochs: int = 10
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_epochs: float = 0.5
    seed: int = 0
    threads: int = 2
    images: int | None = None

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "threads"):
            check_count(name, getattr(self, name))
        if self.images is not None:
            check_count("images", self.images)
        for name in ("lr", "weight_decay", "warmup_epochs"):
            check_number(name, getattr(self, name), 0.0)
        check_count("seed", self.seed, 0)

    def to_dict(self) -> dict:
        return asdict(self)


def contrastive_loss(images: Tensor, texts: Tensor, scale: Tensor) -> Tensor:
    """() the symmetric cross-entropy of matching image i to text i among the batch's, on
    embeddings (B, D) (normalized here) with logits ``scale * cos``."""
    images, texts = F.normalize(images, dim=-1), F.normalize(texts, dim=-1)
    logits = scale * images @ texts.T
    target = torch.arange(len(images), device=images.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def train_contrastive(
    model: nn.Module, tokenizer: Callable[[Sequence[str]], Tensor], images: Tensor,
    captions: Sequence[str], config: ContrastiveConfig,
    evaluate: Callable[[nn.Module], dict] | None = None, progress: bool = True,
    device: str = "cpu",
) -> list[dict]:  # fmt: skip
    """Train an open_clip-style ``model`` (``encode_image``, ``encode_text``, ``logit_scale``)
    on ``images`` (N, C, H, W) and their ``captions`` (each batch moved to ``device``, where the
    model is); returns one record per epoch (the mean loss, the temperature, the seconds, and
    what ``evaluate(model)`` returns)."""
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    tokens = tokenizer(list(captions))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                  weight_decay=config.weight_decay)  # fmt: skip
    steps_per_epoch = len(images) // config.batch_size
    total, warm = config.epochs * steps_per_epoch, config.warmup_epochs * steps_per_epoch
    generator = torch.Generator().manual_seed(config.seed)
    history, step = [], 0
    for epoch in range(config.epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(images), generator=generator)
        losses = []
        batches = range(steps_per_epoch)
        for b in tqdm(batches, disable=not progress, desc=f"epoch {epoch + 1}", leave=False):
            rows = order[b * config.batch_size : (b + 1) * config.batch_size]
            for group in optimizer.param_groups:
                group["lr"] = config.lr * _schedule(step, warm, total)
            embedded = (model.encode_image(images[rows].to(device)),
                        model.encode_text(tokens[rows].to(device)))  # fmt: skip
            loss = contrastive_loss(*embedded, model.logit_scale.exp())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():  # CLIP clips the temperature at 100
                model.logit_scale.clamp_(0, math.log(100))
            losses.append(float(loss.detach()))
            step += 1
        model.eval()
        record = {"epoch": epoch + 1, "loss": sum(losses) / len(losses),
                  "logit_scale": float(model.logit_scale.detach().exp()),
                  "seconds": time.perf_counter() - start}  # fmt: skip
        if evaluate is not None:
            record.update(evaluate(model))
        history.append(record)
    return history


def _schedule(step: int, warm: float, total: int) -> float:
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1.0, total - warm)))


@torch.no_grad()
def zero_shot_accuracy(
    model: nn.Module, tokenizer: Callable[[Sequence[str]], Tensor], images: Tensor,
    labels: Tensor, classes: Sequence[str], template: str = "a {}", batch_size: int = 512,
) -> float:  # fmt: skip
    """The fraction of ``images`` whose nearest prompt ``template.format(class)`` (cosine in the
    joint space) is their label's."""
    device = next(model.parameters()).device
    prompts = model.encode_text(tokenizer([template.format(c) for c in classes]).to(device))
    right = 0
    for start in range(0, len(images), batch_size):
        embedded = model.encode_image(images[start : start + batch_size].to(device))
        predicted = zero_shot_predictions(embedded, prompts).cpu()
        right += int((predicted == labels[start : start + batch_size]).sum())
    return right / len(images)
