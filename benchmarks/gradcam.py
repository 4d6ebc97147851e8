"""Grad-CAM cost, side by side in one run, as ratios to a plain inference forward.

deit_small_patch16_224 (random weights), batch 16, 224 px; the same class index for every image:
  plain        the model's forward under torch.inference_mode (timm's fused attention on)
  vizkit       vk.gradcam(model, x, target) (input of the last block, the default)
  grad-cam     pytorch-grad-cam's GradCAM on the same activation (output of blocks[-2]) with
               a layout reshape, as its README sets it up

Rounds as in benchmarks/capture.py (rotated order, two untimed calls, one timed); median ratio,
with peak allocated GPU memory on CUDA. Also printed: the bytes autograd saves for backward
(distinct storages, `torch.autograd.graph.saved_tensors_hooks`) for vizkit, for the tail it
needs (the last block, norm and head, from a leaf at the last block's input, parameters frozen)
and for plain autograd to the input with parameters requiring grad.
Usage: python benchmarks/gradcam.py [--batch 16] [--repeats 5] [--device cpu|cuda]
       [--dtype float32|bfloat16|float16]
"""

from __future__ import annotations

import numpy as np
import torch
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from timing import deit_setup, header, precision, print_table, rotated_rounds

import vizkit as vk
from vizkit.hooks import saved_bytes


def tail(model, x, target: int) -> None:
    """The gradient of the target at the last block's input, computed from there alone."""
    with torch.no_grad():
        h = model.blocks[:-1](model.norm_pre(model._pos_embed(model.patch_embed(x))))
    h.requires_grad_(True)
    with vk.hooks.frozen_parameters(model):
        out = model.forward_head(model.norm(model.blocks[-1](h)))
        torch.autograd.grad(out[:, target].sum(), h)


def whole(model, x, target: int) -> None:
    """Plain autograd to the input, parameters requiring grad (what Grad-CAM recorded before)."""
    x = x.clone().requires_grad_(True)
    torch.autograd.grad(model(x)[:, target].sum(), x)


def main() -> None:
    args, model, x = deit_setup(__doc__.splitlines()[0])
    target = 3
    layout = vk.token_layout(model, (224, 224))

    def reshape(tokens: torch.Tensor) -> torch.Tensor:  # (B, N, C) -> (B, C, gh, gw)
        patches = tokens[:, layout.num_prefix_tokens :]
        return patches.reshape(len(tokens), *layout.grid, -1).permute(0, 3, 1, 2)

    cam = GradCAM(model, target_layers=[model.blocks[-2]], reshape_transform=reshape)
    targets = [ClassifierOutputTarget(target)] * args.batch

    def plain() -> None:
        with torch.inference_mode():
            model(x)

    runs = {
        "plain": plain,
        "vizkit": lambda: vk.gradcam(model, x, target=target),
        "grad-cam": lambda: cam(x, targets=targets),
    }
    with precision(args):
        ours = vk.gradcam(model, x, target=target).upsample().flatten(1).cpu().numpy()
        theirs = cam(x, targets=targets).reshape(args.batch, -1)
        agreement = min(np.corrcoef(a, b)[0, 1] for a, b in zip(ours, theirs, strict=True))
        saved = {
            "vizkit": saved_bytes(runs["vizkit"]),
            "tail": saved_bytes(lambda: tail(model, x, target)),
            "whole graph": saved_bytes(lambda: whole(model, x, target)),
        }
        times, faults = rotated_rounds(runs, args.repeats, args.device)
    cam.__exit__(None, None, None)

    title = header(args, f"; min Pearson vizkit vs grad-cam per map {agreement:.5f}")
    print_table(times, faults, "plain", args, title)
    print("saved for backward: " + ", ".join(f"{k} {v / 1e6:,.0f} MB" for k, v in saved.items()))
    print(f"vizkit / tail: {saved['vizkit'] / saved['tail']:.2f}x")


if __name__ == "__main__":
    main()
