"""A small, readable trainer: AdamW, warm-up + cosine schedule, label smoothing, callbacks.
Classification, or segmentation where the data's labels are (H, W) maps (`vizkit.train.dense`:
per-pixel cross-entropy, mean IoU and pixel accuracy)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import get_args, get_type_hints

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ..hooks.scores import model_logits
from .dense import is_dense_data, pixel_cross_entropy, pixel_logits, segmentation_scores
from .mixing import mix_batch, mixed_cross_entropy

__all__ = ["Callback", "TrainConfig", "loss_and_accuracy", "train"]

# on_epoch_end(model, epoch, eval_batch) -> values stored in the history under that epoch
Callback = Callable[[nn.Module, int, Tensor], dict]


@dataclass
class TrainConfig:
    """Hyper-parameters of one run (stored in the model card)."""

    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 2.0
    label_smoothing: float = 0.1
    augment: bool = False  # random translation by up to 1/8 of the side (+ flips if `flip`)
    flip: bool = True  # off for data whose class changes when mirrored (digits)
    mixup: float = 0.0  # Beta(alpha, alpha) of Mixup; 0 is off (the DeiT recipe: 0.8)
    cutmix: float = 0.0  # Beta(alpha, alpha) of CutMix; 0 is off (the DeiT recipe: 1.0)
    seed: int = 0
    threads: int | None = None  # torch.set_num_threads for the run; None leaves it as it is
    eval_batch_size: int = 500

    def __post_init__(self) -> None:
        """Refuse a field of the wrong type or below its minimum (recipes are hand-written)."""
        hints = get_type_hints(type(self))
        for f in fields(self):
            _check_field(f.name, getattr(self, f.name), hints[f.name])

    def to_dict(self) -> dict:
        return asdict(self)


_COUNTS = {"epochs", "batch_size", "eval_batch_size", "threads"}  # >= 1; other numbers >= 0


def _check_field(name: str, value: object, hint: type) -> None:
    """``value`` is of type ``hint`` (an int is a float; a bool is not an int) and in range."""
    allowed = get_args(hint) or (hint,)
    if float in allowed:
        allowed = (*allowed, int)
    if type(value) not in allowed:
        names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
        raise ValueError(f"{name} must be {names}; got {value!r}.")
    low = 1 if name in _COUNTS else 0
    if type(value) in (int, float) and value < low:
        raise ValueError(f"{name} must be >= {low}; got {value!r}.")


def _augment(images: Tensor, flip: bool, generator: torch.Generator) -> Tensor:
    """Randomly translate (reflect-padded crop) and optionally mirror a batch (B, C, H, W)."""
    _, _, h, w = images.shape
    pad = max(1, h // 8)
    padded = F.pad(images, (pad, pad, pad, pad), mode="reflect")  # (B, C, H + 2p, W + 2p)
    dy, dx = torch.randint(0, 2 * pad + 1, (2, len(images)), generator=generator).tolist()
    out = torch.stack([p[:, y : y + h, x : x + w] for p, y, x in zip(padded, dy, dx, strict=True)])
    if flip:
        mirror = torch.rand(len(images), generator=generator) < 0.5
        out[mirror] = out[mirror].flip(-1)
    return out


def _lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def loss_and_accuracy(model: nn.Module, data: Dataset, batch_size: int = 500) -> dict:
    """Mean cross-entropy and accuracy of ``model`` on ``data`` (items (image, label, ...));
    per pixel, with the mean IoU ("miou"), where the labels are (H, W) maps
    (`vizkit.train.dense.segmentation_scores`)."""
    if is_dense_data(data):
        return segmentation_scores(model, data, batch_size)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, correct, count = 0.0, 0, 0
    for images, labels, *_ in DataLoader(data, batch_size=batch_size):
        logits = model_logits(model(images.to(device)))  # a transformers output's logits
        labels = labels.to(device)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(-1) == labels).sum().item()
        count += len(labels)
    model.train(was_training)
    return {"loss": loss_sum / count, "accuracy": correct / count}


def train(
    model: nn.Module,
    train_data: Dataset,
    test_data: Dataset,
    config: TrainConfig,
    callbacks: Sequence[Callback] = (),
    progress: bool = True,
) -> list[dict]:
    """Train ``model`` in place; evaluate on ``test_data`` after every epoch.

    Data whose items' labels are (H, W) maps train a segmentation model: the loss is the
    per-pixel cross-entropy of its logits resized bilinearly to the labels (as transformers'
    post-processing resizes them to the image; `vizkit.train.dense`), the accuracies are per
    pixel and the history adds the test mean IoU ("test_miou").

    Returns:
        the history: one dict per epoch with train/test loss and accuracy, learning rate,
        seconds, and whatever each callback returned for that epoch.
    """
    if len(train_data) == 0 or len(test_data) == 0:
        raise ValueError("train_data and test_data must both hold at least one sample.")
    moved = [n for n in ("augment", "mixup", "cutmix") if getattr(config, n)]
    if moved and is_dense_data(train_data):
        raise ValueError(
            f"{', '.join(moved)} move or mix the images but not their pixel labels, so a "
            "segmentation data set (labels (H, W) per image) cannot take them: set "
            f"{', '.join(moved)} off (false, 0) in the recipe's train."
        )
    previous_threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        return _run(model, train_data, test_data, config, callbacks, progress)
    finally:
        torch.set_num_threads(previous_threads)


def _run(model, train_data, test_data, config, callbacks, progress) -> list[dict]:
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    device = next(model.parameters()).device
    loader = DataLoader(
        train_data,
        batch_size=config.batch_size,
        shuffle=True,
        generator=generator,
        drop_last=len(train_data) > config.batch_size,
    )
    exempt = set(getattr(model, "no_weight_decay", set)())  # timm: pos_embed, cls_token, ...
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim <= 1 or name in exempt else decay).append(param)
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
    )
    total = config.epochs * len(loader)
    warmup = max(1, round(config.warmup_epochs * len(loader)))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, total, warmup))
    eval_batch = next(iter(DataLoader(test_data, batch_size=min(64, len(test_data)))))[0]
    dense = is_dense_data(train_data)
    history: list[dict] = []
    for epoch in range(config.epochs):
        start = time.perf_counter()
        model.train()
        loss_sum, correct, count = 0.0, 0, 0
        bar = tqdm(
            loader, desc=f"epoch {epoch + 1}/{config.epochs}", disable=not progress, leave=False
        )
        for images, labels, *_ in bar:
            if config.augment:
                images = _augment(images, config.flip, generator)
            partners, lam = labels, 1.0
            if config.mixup > 0 or config.cutmix > 0:
                images, partners, lam = mix_batch(
                    images, labels, config.mixup, config.cutmix, generator
                )
            images, labels, partners = images.to(device), labels.to(device), partners.to(device)
            if dense:  # per pixel: the logits at the labels' size, (B, K, H, W)
                logits = pixel_logits(model(images), tuple(labels.shape[-2:]))
                loss = pixel_cross_entropy(logits, labels, config.label_smoothing)
                logits = logits.detach().movedim(1, -1)  # (B, H, W, K): argmax(-1) per pixel
            else:
                logits = model_logits(model(images))
                loss = mixed_cross_entropy(logits, labels, partners, lam, config.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            loss_sum += loss.item() * labels.numel()
            correct += (logits.argmax(-1) == (labels if lam >= 0.5 else partners)).sum().item()
            count += labels.numel()
            bar.set_postfix(loss=f"{loss_sum / count:.3f}", acc=f"{correct / count:.3f}")
        test = loss_and_accuracy(model, test_data, config.eval_batch_size)
        record = {
            "epoch": epoch + 1,
            "train_loss": loss_sum / count,
            "train_accuracy": correct / count,
            "test_loss": test["loss"],
            "test_accuracy": test["accuracy"],
            **({"test_miou": test["miou"]} if dense else {}),
            "lr": optimizer.param_groups[0]["lr"],
            "seconds": time.perf_counter() - start,
        }
        model.eval()
        for callback in callbacks:
            record.update(callback(model, epoch + 1, eval_batch.to(device)))
        history.append(record)
        if progress:
            tqdm.write(
                f"epoch {epoch + 1:3d}  train loss {record['train_loss']:.3f} acc "
                f"{record['train_accuracy']:.3f}  test loss {test['loss']:.3f} acc "
                f"{test['accuracy']:.3f}  {record['seconds']:.0f} s"
            )
    model.eval()
    return history
