"""Saliency methods' cost beside their peers, in one run, as ratios to the plain forward.

Table 1, the CAM family on a timm ViT (default vit_tiny_patch16_224 at 112 px, random weights,
batch 2; the layer both read: the last block's input): vizkit's `vk.<method>` and
pytorch-grad-cam's class of the same name (its reshape of the tokens written out; Score-CAM's and
Ablation-CAM's passes of 64 copies: pytorch-grad-cam's batch_size, vizkit's max_bytes of 64
images' forward). Table 2, LeGrad on torchvision's ViT (3 blocks of width 192 at 112 px):
`vk.legrad` and torch-cam's `LeGrad` with the same readout. Table 3, relevance propagation on
the same torchvision ViT: `vk.attnlrp` (AttnLRP and CP-LRP) against LXT 2.1's patches with the
same rules (tests/lxt_oracle.py), beside Grad-CAM (vizkit's and pytorch-grad-cam's, the last
block's input), the plain input gradient and `vk.transformer_attribution`.

Each round runs the methods in turn, order rotated; one untimed warm-up each, then one timed call
per round (the perturbation methods take seconds). Reported: the median over rounds.
Usage: python benchmarks/saliency_methods.py [--model NAME] [--batch 2] [--size 112]
       [--repeats 3] [--device cpu] [--record]
"""

from __future__ import annotations

import torch
from pytorch_grad_cam import (
    AblationCAM,
    EigenCAM,
    GradCAM,
    GradCAMPlusPlus,
    HiResCAM,
    LayerCAM,
    ScoreCAM,
    XGradCAM,
)
from pytorch_grad_cam.ablation_layer import AblationLayerVit
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from timing import add_device_options, device_name, print_table, rotated_rounds

import vizkit as vk
from vizkit.hooks.passes import one_image_bytes

PEERS = {
    "gradcam": GradCAM,
    "gradcam_pp": GradCAMPlusPlus,
    "xgradcam": XGradCAM,
    "hirescam": HiResCAM,
    "layercam": LayerCAM,
    "eigencam": EigenCAM,
    "scorecam": ScoreCAM,
    "ablationcam": AblationCAM,
}
CHUNK = 64  # perturbed images per forward, for both


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_tiny_patch16_224")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--repeats", type=int, default=3)
    args = add_device_options(parser).parse_args()
    args.dtype = "float32"
    cams(args)
    legrad(args)
    relevance(args)


def cams(args) -> None:
    torch.manual_seed(0)
    model = vk.create_model(args.model, img_size=args.size).eval().to(args.device)
    x = torch.randn(args.batch, 3, args.size, args.size, device=args.device)
    targets = [ClassifierOutputTarget(i) for i in range(args.batch)]
    layout = vk.HookedModel(model).token_layout((args.size, args.size))

    def reshape(tokens):  # (B, N, C) -> (B, C, gh, gw)
        patches = tokens[:, layout.num_prefix_tokens :]
        return patches.reshape(len(tokens), *layout.grid, -1).permute(0, 3, 1, 2)

    chunk_bytes = CHUNK * one_image_bytes(model, x, gradients=False)
    layer, ours_layer = model.blocks[-2], f"blocks.{len(model.blocks) - 1}.hook_resid_pre"
    runs = {"plain": lambda: model(x)}
    for name, peer in PEERS.items():
        options = {"reshape_transform": reshape}
        if name == "ablationcam":
            options["ablation_layer"] = AblationLayerVit()
        cam = peer(model, target_layers=[layer], **options)
        if name in ("scorecam", "ablationcam"):
            cam.batch_size = CHUNK
        extra = {"max_bytes": chunk_bytes} if name in ("scorecam", "ablationcam") else {}
        method = getattr(vk, name)
        kwargs = {} if name == "eigencam" else {"target": list(range(args.batch))}
        runs[f"vizkit {name}"] = lambda m=method, kw=kwargs, e=extra: m(
            model, x, layer=ours_layer, **kw, **e
        )
        runs[f"pgc {name}"] = lambda c=cam: c(x, targets=targets)
    times, faults = rotated_rounds(runs, args.repeats, args.device, untimed=0)
    title = (
        f"{args.model} (random weights), batch {args.batch}, {args.size} px, float32, "
        f"{device_name(args.device)}, torch {torch.__version__}; vizkit against pytorch-grad-cam "
        f"(pgc); median of {args.repeats} rounds"
    )
    print_table(times, faults, "plain", args, title)
    print()


def _torchvision_vit(args):
    """torchvision's ViT (3 blocks of width 192, its head drawn, not zero), a batch, classes."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(
        image_size=args.size, patch_size=16, num_layers=3, num_heads=3, hidden_dim=192,
        mlp_dim=768, num_classes=10,
    ).eval().to(args.device)  # fmt: skip
    torch.nn.init.normal_(model.heads.head.weight)
    x = torch.randn(args.batch, 3, args.size, args.size, device=args.device)
    return model, x, list(range(args.batch))


def legrad(args) -> None:
    from torchcam.methods import LeGrad

    model, x, classes = _torchvision_vit(args)

    def readout(tokens):
        return model.heads(model.encoder.ln(tokens)[:, 0])

    def theirs():
        with LeGrad(model, list(model.encoder.layers), score_projection=readout) as cam:
            return cam(classes, model(x), normalized=False)

    runs = {
        "plain": lambda: model(x),
        "vizkit legrad": lambda: vk.legrad(model, x, target=classes),
        "torch-cam legrad": theirs,
    }
    times, faults = rotated_rounds(runs, args.repeats, args.device, untimed=0)
    title = (
        f"torchvision VisionTransformer (3 blocks, width 192, random weights), batch "
        f"{args.batch}, {args.size} px, float32, {device_name(args.device)}, torch "
        f"{torch.__version__}; LeGrad, vizkit against torch-cam; median of {args.repeats} rounds"
    )
    print_table(times, faults, "plain", args, title)


def relevance(args) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from lxt_oracle import lxt_relevance

    model, x, classes = _torchvision_vit(args)
    layer = model.encoder.layers[-1]
    ours_layer = f"encoder.layers.encoder_layer_{len(model.encoder.layers) - 1}.hook_resid_pre"
    cam = GradCAM(model, target_layers=[layer], reshape_transform=_class_token_dropped)
    targets = [ClassifierOutputTarget(i) for i in classes]
    runs = {
        "plain": lambda: model(x),
        "vizkit attnlrp": lambda: vk.attnlrp(model, x, target=classes),
        "LXT attnlrp": lambda: lxt_relevance(model, x, classes, "attnlrp"),
        "vizkit attnlrp cp": lambda: vk.attnlrp(model, x, target=classes, attention="cp"),
        "LXT cp": lambda: lxt_relevance(model, x, classes, "cp"),
        "vizkit saliency": lambda: vk.saliency(model, x, target=classes),
        "vizkit gradcam": lambda: vk.gradcam(model, x, target=classes, layer=ours_layer),
        "pgc gradcam": lambda: cam(x, targets=targets),
        "vizkit transformer_attribution": lambda: vk.transformer_attribution(model, x, classes),
    }
    times, faults = rotated_rounds(runs, args.repeats, args.device, untimed=0)
    title = (
        f"Relevance propagation on torchvision VisionTransformer (3 blocks, width 192, random "
        f"weights), batch {args.batch}, {args.size} px, float32, {device_name(args.device)}, "
        f"torch {torch.__version__}; vizkit against LXT 2.1, beside Grad-CAM; median of "
        f"{args.repeats} rounds"
    )
    print_table(times, faults, "plain", args, title)


def _class_token_dropped(tokens):
    """torchvision ViT tokens (B, 1 + N, C) -> (B, C, gh, gw) for pytorch-grad-cam."""
    patches = tokens[:, 1:]
    side = int(patches.shape[1] ** 0.5)
    return patches.reshape(len(tokens), side, side, -1).permute(0, 3, 1, 2)


if __name__ == "__main__":
    main()
