"""The copies of each image that SmoothGrad and GradientSHAP average over (noise samples,
points towards baselines), run in passes of a given number of images. Each copy draws its
randomness from its own generator, seeded from the call's ``seed``, so the maps are the same
however the copies are split into passes (whatever memory budget or device memory is free)
and the caller's random state is never touched."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..hooks.inputs import check_number

__all__ = ["mean_over_copies", "noise_deviation", "noisy_copies", "target_gradient",
           "working_dtype"]  # fmt: skip

Attribute = Callable[[Tensor, list[torch.Generator]], Tensor]


def mean_over_copies(
    x: Tensor, samples: int, per_pass: int, seed: int, attribute: Attribute
) -> Tensor:
    """(B, ...) float32 or x's float64: for each image of x (B, C, H, W) the mean over its
    ``samples`` copies of ``attribute(rows, generators)``, which gives (n, ...) for n copies
    of the images ``rows`` (n,) (gradients (n, C, H, W), a method's maps (n, h, w)), each
    copy drawing from its own generator; ``per_pass`` copies at a time, image by image."""
    seeds = torch.randint(
        0, 2**62, (len(x) * samples,), generator=torch.Generator().manual_seed(seed)
    )
    total = None
    for copies in torch.arange(len(x) * samples).split(per_pass):
        generators = [torch.Generator(x.device).manual_seed(int(seeds[c])) for c in copies]
        rows = (copies // samples).to(x.device)
        attributions = attribute(rows, generators).to(working_dtype(x))
        if total is None:
            total = attributions.new_zeros((len(x), *attributions.shape[1:]))
        images, counts = torch.unique_consecutive(copies // samples, return_counts=True)
        for image, part in zip(images.tolist(), attributions.split(counts.tolist()), strict=True):
            total[image] += part.sum(0)  # in a fixed order (index_add_ is not, on CUDA)
    return total / samples


def noise_deviation(x: Tensor, noise: float) -> float:
    """The noise's standard deviation for images x: ``noise`` (>= 0; 0 gives copies of the
    images themselves) times the batch's value range (Smilkov et al. 2017, Sec. 3)."""
    noise = check_number("noise", noise, 0.0)
    return float(noise * (x.max() - x.min()).detach())


def noisy_copies(x: Tensor, rows: Tensor, generators: list[torch.Generator], stdev: float):
    """(n, C, H, W) the images ``rows`` (n,) of x (B, C, H, W), in `working_dtype`, each plus
    Gaussian noise of standard deviation ``stdev`` drawn from its own generator."""
    images = x.detach().to(working_dtype(x))
    draws = [torch.randn(x.shape[1:], generator=g, device=x.device, dtype=images.dtype)
             for g in generators]  # fmt: skip
    return images[rows] + stdev * torch.stack(draws)


def working_dtype(x: Tensor) -> torch.dtype:
    """The dtype copies of x are made and averaged in: float32, or float64 for float64 images
    (half-precision images are copied in float32; the model gets them in its own dtype)."""
    return torch.promote_types(x.dtype, torch.float32)


def target_gradient(
    forward: Callable[[Tensor, Tensor], Tensor], points: Tensor, rows: Tensor,
    targets: Tensor | None,
) -> Tensor:  # fmt: skip
    """(n, C, H, W) the gradient of each copy's target score at ``points`` (n, C, H, W), the
    copies of images ``rows`` (n,): ``forward(points, rows)`` gives (n, K) logits, read at the
    images' ``targets`` (B,), or with ``targets`` None the (n,) scores themselves."""
    with torch.enable_grad():  # also inside the caller's no_grad
        points = points.detach().requires_grad_(True)
        scores = forward(points, rows)
        if targets is not None:
            scores = scores.gather(1, targets[rows][:, None])
        return torch.autograd.grad(scores.sum(), points)[0]
