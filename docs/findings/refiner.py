"""The findings of docs/papers/refiner.md, measured as notebooks/02_refiner.ipynb measures them:
the 6-block ViT, the same ViT with a strong recipe, the Refined-ViT of the same shape and the
ResNet, on 256 Shapes test images (CKA, crop ratios) and the 64 sample images (maps)."""

from __future__ import annotations

import torch
from statements import expect, fixed, percent

import vizkit as vk
from vizkit.analysis.attention_stats import locality_mass
from vizkit.models import param_count

MODELS = {
    "vit": "refiner_vit_shapes",
    "strong": "refiner_vit_strong_shapes",
    "refined": "refined_vit_shapes",
    "resnet": "resnet_tiny_shapes",
}
RATIOS = (1.0, 1.05)  # Table 5's crop ratio: the image shrunk from 32 to 30 pixels
DEEP_BLOCKS = (2, 4)  # where the page compares the maps' entropy and locality
SHARES = {"rfc": "test_images"}  # accuracies: shares of the test images (record.py: SHARES)


def measure() -> dict:
    images, _, _ = vk.datasets.load_sample()
    test = vk.datasets.Shapes("test", n=256)
    models = {key: vk.zoo.load(name)[0] for key, name in MODELS.items()}
    f_out = {k: vk.feature_evolution(m, test, progress=False).curve[-1] for k, m in models.items()}
    expect(f_out["resnet"] > f_out["vit"], "the ResNet's features end further from its first "
           "block's than the ViT's (Fig. 2)")  # fmt: skip
    expect(f_out["strong"] < f_out["vit"] and f_out["refined"] < f_out["vit"],
           "the strong-recipe ViT and the Refined-ViT evolve less than the ViT")  # fmt: skip

    stats = {k: vk.attention(models[k], images).stats() for k in ("vit", "strong", "refined")}
    entropy = {k: s["entropy"].mean((1, 2)) for k, s in stats.items()}
    local = {k: s["locality"].mean((1, 2)) for k, s in stats.items()}
    deep = list(DEEP_BLOCKS)
    expect(bool((entropy["refined"][deep] < entropy["vit"][deep]).all()), "the Refined-ViT's "
           "softmax maps are less uniform than the ViT's at blocks 2 and 4")  # fmt: skip
    expect(abs(entropy["refined"][-1] - entropy["vit"][-1]) < 0.05,
           "in the last block the two are about as uniform")  # fmt: skip
    layout = vk.attention(models["vit"], images[:1]).layout
    uniform = locality_mass(torch.full((layout.num_tokens,) * 2, 1 / layout.num_tokens), layout)
    most = max(v.max().item() for v in local.values())
    expect(most < 1.5 * uniform.item(), "no model puts much more than uniform attention on the "
           "3 x 3 neighbourhood")  # fmt: skip
    expect(bool((local["refined"][deep] < local["vit"][deep] + 0.01).all()), "at blocks 2 and 4, "
           "where its maps are least uniform, the Refined-ViT puts no more of its attention on "
           "the 3 x 3 neighbourhood than the ViT")  # fmt: skip

    applied = vk.attention(models["refined"], images, maps="applied").stats()
    negative = applied["negative_mass"].mean().item()
    expect(0.4 <= negative <= 0.6, "about half of the refined maps' magnitude is negative")

    rfc = {
        k: vk.papers.refiner.crop_ratio_accuracy(m, test, RATIOS, progress=False)
        for k, m in models.items()
    }
    expect(all(rfc[k][1.05] < rfc[k][1.0] / 2 for k in ("vit", "strong", "refined"))
           and rfc["resnet"][1.05] > 0.9, "padding costs the transformers, while the ResNet keeps "
           "its accuracy")  # fmt: skip
    params = {name: _params(name) for name in ("base", "s", "m", "l")}
    expect(all(abs(p / 1e6 - paper) < 0.6 for p, paper in zip(params.values(), (86, 25, 55, 81),
                                                               strict=True)),
           "the parameter counts match Table 10's 86 / 25 / 55 / 81M")  # fmt: skip
    return {
        "test_images": len(test),
        "f_out": {k: fixed(v) for k, v in f_out.items()},
        "entropy": {k: [fixed(e[b].item()) for b in DEEP_BLOCKS] for k, e in entropy.items()},
        "entropy_last": {k: fixed(e[-1].item()) for k, e in entropy.items()},
        "local": {k: [fixed(v[b].item(), 3) for b in DEEP_BLOCKS] for k, v in local.items()},
        "max_local_mass": fixed(most, 3),
        "uniform_local_mass": fixed(uniform.item(), 3),
        "negative_mass": fixed(negative),
        "dla_error": _dla_error(models["refined"], images),
        "rfc": {k: {str(r): percent(a) for r, a in acc.items()} for k, acc in rfc.items()},
        "params": {name: f"{p / 1e6:.2f}M" for name, p in params.items()},
        "params_s_unshared": f"{param_count('vizkit_refined_vit_s', share_blocks=0) / 1e6:.2f}M",
    }


def _params(name: str) -> int:
    """Table 10: the parameters of Refined-ViT-``name`` as built."""
    return vk.papers.refiner.refined_vit_params(f"vizkit_refined_vit_{name}")["params"]


def _dla_error(refined, images) -> dict[str, str]:
    """Sec. 3.3: convolving a trained softmax map with a learned kernel, then multiplying the
    values, against aggregating the values locally, then attending globally; max |difference|."""
    stages = vk.papers.refiner.refiner_stages(refined, images[:4], layer=3)
    softmax_map, kernel = stages.maps["softmax"][0, 0].double(), stages.kernels[0].double()
    values = torch.randn(softmax_map.shape[0], 8, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(0))  # fmt: skip
    local_form = vk.papers.refiner.attend_local_values(softmax_map, kernel, values)
    error = {
        padding: (vk.papers.refiner.convolve_maps(softmax_map, kernel, padding) @ values
                  - local_form).abs().max().item()
        for padding in ("zeros", "replicate")
    }  # fmt: skip
    expect(error["zeros"] < 1e-10 < 1e-3 < error["replicate"],
           "the identity holds with zero padding and breaks with replicated borders")  # fmt: skip
    return {padding: f"{e:.0e}" for padding, e in error.items()}
