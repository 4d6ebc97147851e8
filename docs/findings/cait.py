"""The findings of docs/papers/cait.md, measured as notebooks/01_cait.ipynb measures them: the
residual ratios and LayerScale statistics the trainer tracked after every epoch (on the first 64
Shapes test images) for the 12-block ViTs with and without LayerScale, the class attention of
`cait_tiny_shapes` on the 64 sample images, and every timm `cait_*` model on the meta device
against Table 3."""

from __future__ import annotations

import torch
from statements import expect, fixed, percent

import vizkit as vk

MODELS = {"plain": "vit_deep_shapes", "layerscale": "vit_deep_layerscale_shapes"}
BRANCHES = ("attn", "mlp")


def measure() -> dict:
    cards = {key: vk.zoo.load(name)[1] for key, name in MODELS.items()}
    tracked = {
        k: vk.train.tracked_results(card["history"], "residual_ratios") for k, card in cards.items()
    }
    uniformity = {k: vk.analysis.ratio_uniformity(entries) for k, entries in tracked.items()}
    expect(all(s > p for b in BRANCHES for s, p in zip(uniformity["layerscale"][b]["cv"],
                                                       uniformity["plain"][b]["cv"], strict=True)),
           "LayerScale makes the ratios less uniform here (the ledger's Fig. 4 rows)")  # fmt: skip

    gammas = cards["layerscale"]["history"][-1]["layerscale"]  # the tracker's last epoch
    last, eps = tracked["layerscale"][-1], cards["layerscale"]["kwargs"]["init_values"]
    factor = torch.cat([last.attn / last.attn_unscaled, last.mlp / last.mlp_unscaled])
    expect(bool(((factor > eps / 2) & (factor < 2 * eps)).all()),
           "the scaled ratios are still close to ε times the unscaled ones")  # fmt: skip

    images, _, masks = vk.datasets.load_sample()
    cait = vk.zoo.load("cait_tiny_shapes")[0]
    inside = [vk.metrics.energy_in_mask(vk.class_attention(cait, images, layer=j), masks)
              .mean().item() for j in range(2)]  # fmt: skip
    expect(inside[1] > inside[0], "the opposite of Fig. 6 holds: CA layer 2 puts more of its "
           "mass inside the object mask than CA layer 1")  # fmt: skip

    mixing = vk.papers.cait.talking_heads(cait)
    heads = torch.eye(mixing.pre_softmax.shape[-1])
    expect(all((p - heads).abs().amax((1, 2)).min() > 0.1
               for p in (mixing.pre_softmax, mixing.post_softmax)),
           "the talking heads started at the identity and learned away from it")  # fmt: skip

    rows = vk.papers.cait.cait_family_table()
    macs = max(abs(r.flops_diff_percent) for r in rows)
    expect(all(round(r.params_224, 1) == r.paper_params for r in rows),
           "parameters match Table 3 to its rounding for all models")  # fmt: skip
    expect(macs <= 1.2, "forward multiply-accumulates are within 1.2 % of Table 3")
    return {
        "sample_images": len(images),
        "final_ratio": {
            k: {b: fixed(u[b]["mean"][-1]) for b in BRANCHES} for k, u in uniformity.items()
        },
        "mean_abs_lambda": {
            b: [fixed(f(gammas[b]["mean_abs"])) for f in (min, max)] for b in BRANCHES
        },
        "channels": [
            fixed(min(min(gammas[b]["min"]) for b in BRANCHES), 3),
            fixed(max(max(gammas[b]["max"]) for b in BRANCHES)),
        ],
        "scaled_over_unscaled": [fixed(factor.min().item()), fixed(factor.max().item())],
        "ca_inside": [fixed(v) for v in inside],
        "object_area": fixed(masks.float().mean().item()),
        "table3": {"models": len(rows), "max_macs_diff": percent(macs / 100)},
    }
