"""The rest of the analyses at ViT-B size (`benchmarks/scale.py --rows analyses`): random-init
ViT-B/16 (timm, 1,000 classes) at 224 px, each analysis timed beside the passes its definition
needs (`side_by_side`: rotated rounds in one process; peak memory from the profiler). Where
a gap is inherent, the row's analysis says so below.

- `register_neurons` (Jiang et al. 2025, "Vision Transformers Don't Need Trained Registers",
  Sec. 3.2), the paper's OpenCLIP B/16 setting (outliers at the last block, candidates blocks
  0-5), 4 images: the outliers must be known before the candidate blocks' neurons are scored
  at them, so the definition is a forward of the images and a second pass through the
  candidate blocks (one pass would hold every candidate block's MLP activations, here
  6 x (B, 197, 3,072)). A random-init model writes no artifacts: ``factor=1.05`` flags
  patches in every image, so every image is scored.
- `register_effect`, 1 image, 2 curve steps: the runs without and with the register, and per
  model the deletion and insertion curves (each baseline and its perturbed steps). Its peak
  holds the attention maps (B, 12, N, N) of the block it compares, which the fused kernel
  of the limit's forward never writes.
- `fit_text_map`: 6 images, against the forwards of the backbone (ViT-B/16 without a head)
  and of the text-image model (open_clip ViT-B-16).
- `spliced_score`, an autoencoder of 16 x 768 latents (k=32) on the last block's tokens, 4
  images: the clean, spliced and bias-only runs the score compares are three forwards; the
  spliced run adds the autoencoder's encoding and decoding of every token, whose dense
  latents (tokens x 12,288 floats, and the TopK's copies) set the peak.
- `compare_saliency`, 1 image, curves of 2 steps, methods Grad-CAM, AttnLRP, rollout and
  class attention: each method run alone plus the curves' forwards (their ends once, each
  method's perturbed steps).
- `vizkit report`, 8 photos (`benchmarks/report.py`'s), on ViT-B/16 against the same report
  on ViT-S/16 (fresh processes, one each; peak: resident memory above the imports). The two
  reports are most of the group's time.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from scale_ratios import side_by_side
from torch import Tensor, nn

import vizkit as vk
from vizkit.methods.registry import registered
from vizkit.metrics.faithfulness import baseline_images

COMPARED = ["gradcam", "attnlrp", "rollout", "class_attention"]


def analysis_rows(args: argparse.Namespace) -> list[list]:
    """Each analysis's row: what, the limit, its seconds, time and peak as multiples, goal."""
    warnings.simplefilter("ignore")  # a random-init model's predictions are near chance
    model = _vit_b(1000).to(args.device)
    rows = [
        _register_neurons(model, args),
        _register_effect(model, args),
        _text_map(args),
        _spliced(model, args),
        _compare(model, args),
    ]
    return rows + [_report(args)]


def _row(what: str, limit_what: str, goal: str, analysis: Callable, limit: Callable,
         args: argparse.Namespace) -> list:  # fmt: skip
    base, ratio, memory = side_by_side(analysis, limit, args)
    return [what, limit_what, f"{base:.2f}", f"{ratio:.2f}x", f"{memory:.2f}x", goal]


def _vit_b(classes: int) -> nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_base_patch16_224", num_classes=classes).eval()


def _images(count: int, args: argparse.Namespace, seed: int = 3) -> Tensor:
    x = torch.randn(count, 3, 224, 224, generator=torch.Generator().manual_seed(seed))
    return x.to(args.device)


def _through(model: nn.Module, x: Tensor, last: int) -> Tensor:
    """timm ViT ``model``'s residual stream (B, N, C) after block ``last`` (no gradients)."""
    with torch.no_grad():
        x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
        return model.blocks[: last + 1](x)


def _register_neurons(model: nn.Module, args: argparse.Namespace) -> list:
    x = _images(4, args)

    def find() -> None:
        vk.registers.register_neurons(model, x, layer=-1, layers=list(range(6)), factor=1.05,
                                 batch_size=4, progress=False)  # fmt: skip

    def limit() -> None:
        with torch.no_grad():
            model(x)
        _through(model, x, 5)

    return _row("register_neurons, ViT-B/16, 4 images, candidates blocks 0-5",
                "forward, and blocks 0-5 again", "1.5x", find, limit, args)  # fmt: skip


def _register_effect(model: nn.Module, args: argparse.Namespace) -> list:
    x, steps = _images(1, args), 2
    neurons = {3: [5, 9]}

    def effect() -> None:
        vk.registers.register_effect(model, x, neurons, steps=steps)

    base = {"deletion": torch.zeros_like(x), "insertion": baseline_images(x, "blur")}

    def limit() -> None:  # per model: its clean run, each curve's baseline and inner steps
        with torch.no_grad():
            for _ in range(2):
                model(x)
                for kind in ("deletion", "insertion"):
                    model(base[kind])
                    model(torch.cat([x] * (steps - 1)))

    return _row(f"register_effect, ViT-B/16, 1 image, {steps}-step curves",
                "its runs: 2 x (clean, 2 baselines, 2 x 1 step)", "1.5x", effect, limit,
                args)  # fmt: skip


def _text_map(args: argparse.Namespace) -> list:
    import open_clip

    backbone = _vit_b(0).to(args.device)
    torch.manual_seed(0)
    clip = open_clip.create_model("ViT-B-16", pretrained=None).eval().to(args.device)
    x = _images(6, args)

    def fit() -> None:
        vk.text.fit_text_map(backbone, clip, x)

    def limit() -> None:
        with torch.no_grad():
            backbone(x)
            clip.encode_image(x)

    return _row("fit_text_map, ViT-B/16 into open_clip ViT-B-16, 6 images",
                "forward of both models", "1.5x", fit, limit, args)  # fmt: skip


def _spliced(model: nn.Module, args: argparse.Namespace) -> list:
    x = _images(4, args)
    with tempfile.TemporaryDirectory() as folder:
        store = vk.cache_activations(model, x, f"{folder}/store", layers=[-1], tokens="all",
                                     progress=False)  # fmt: skip
        sae = vk.train_sae(store, expansion=16, k=32, tokens=2048, batch_size=512,
                           device=args.device, progress=False)  # fmt: skip

    def score() -> None:
        vk.sae.spliced_score(model, sae, (x,), batch_size=4, progress=False)

    def limit() -> None:
        with torch.no_grad():
            for _ in range(3):
                model(x)

    return _row(f"spliced_score, ViT-B/16, last block, {sae.latents:,} latents, 4 images",
                "3 forwards (clean, spliced, bias only)", "1.5x", score, limit,
                args)  # fmt: skip


def _compare(model: nn.Module, args: argparse.Namespace) -> list:
    x, steps = _images(1, args), 2  # a curve's perturbed images are one forward (up to 10)
    hm = vk.HookedModel(model)
    with torch.no_grad():
        target = model(x).argmax(-1)
    methods = [registered(name) for name in COMPARED]
    base = [torch.zeros_like(x), baseline_images(x, "blur")]

    def compare() -> None:
        vk.compare_saliency(hm, x, COMPARED, steps=steps, progress=False)

    def limit() -> None:  # each method alone; the curves' ends; each method's inner steps
        for method in methods:
            method(hm, x, target)
        with torch.no_grad():
            for image in (x, *base):
                model(image)
            for _ in range(2 * len(methods)):
                model(torch.cat([x] * (steps - 1)))

    return _row(f"compare_saliency, ViT-B/16, 1 image, {len(COMPARED)} methods, {steps}-step "
                "curves", "each method alone, and the curves' forwards", "1.5x", compare, limit,
                args)  # fmt: skip


def _report(args: argparse.Namespace) -> list:
    """`vizkit report` on 8 photos, ViT-B/16 against ViT-S/16, one fresh process each."""
    from report import run_once, sample_photos

    with tempfile.TemporaryDirectory() as folder:
        photos = sample_photos(Path(folder) / "photos", 8)
        costs = {}
        for name in ("vit_small_patch16_224", "vit_base_patch16_224"):
            run = argparse.Namespace(model=name, n=8, data=str(photos), threads=args.threads)
            costs[name] = run_once(run, None)
    small, big = costs.values()
    held = [c["peak GB"] - c["steps"][0][2] for c in (small, big)]  # above the imports
    return ["vizkit report, ViT-B/16, 8 photos", "the same report on ViT-S/16",
            f"{small['seconds']:.2f}", f"{big['seconds'] / small['seconds']:.2f}x",
            f"{held[1] / held[0]:.2f}x", "4x"]  # fmt: skip
