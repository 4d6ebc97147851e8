"""The findings of docs/papers/masks.md, measured as notebooks/03_masks.ipynb measures them: the
seed-0 ViT, ELM-ViT and GMM-ViT (K 5) and the ELM-ViTs of seeds 1 and 2, on the 64 sample images
(attention maps, score scales), their learned masks, the parameter counts of the registered
models against the paper's Tables 3-6, and the test accuracy over seeds 0-2 of every mask type
(the decays and the frozen-mask control beside ELM and GMM)."""

from __future__ import annotations

import statistics

import torch
from statements import expect, fixed, percent

import vizkit as vk

mk = vk.papers.masks
GRID = (8, 8)  # the tiny models' patch grid: 64 x 64 masks
MODELS = {"vit": "masks_gap_s0", "elm": "masks_elm_s0", "gmm": "masks_gmm_k5_s0"}
FLAT, DIAGONAL = 8.0, 0.5  # |sigma| from the grid side up: flat; below 0.5: the diagonal only
UNIFORM_SELF = 1 / 64  # a patch's attention to itself under uniform attention
SHARES = {"fig7.pointing": "sample_images"}  # pointing games: shares of the sample images
ACCURACY_RUNS = {"vit": "masks_gap", "elm": "masks_elm", "gmm": "masks_gmm_k5",
                 "gmm_frozen": "masks_gmm_k5_frozen", "retnet": "masks_retnet",
                 "rmt": "masks_rmt", "retnet_learn": "masks_retnet_learn",
                 "rmt_learn": "masks_rmt_learn", "local": "masks_local"}  # fmt: skip


def measure() -> dict:
    images, _, objects = vk.datasets.load_sample()
    loaded = {key: vk.zoo.load(name) for key, name in MODELS.items()}
    models = {key: model for key, (model, _) in loaded.items()}
    return {
        "sample_images": len(images),
        "fig3": _fig3(models["gmm"]),
        "fig4": _fig4(models["elm"]),
        "kernels": _kernels(*loaded["gmm"]),
        "fig7": _fig7(models, images, objects),
        "params": _params(),
        "accuracy": _accuracy(),
    }


def _fig3(gmm) -> dict:
    """Fig. 3: locality and extroversion of every block's ELM mask of seeds 0-2."""
    elm = torch.stack([torch.cat(list(mk.learned_masks(vk.zoo.load(f"masks_elm_s{seed}")[0])
                                      .values())) for seed in range(3)])  # fmt: skip
    elm = mk.mask_locality(elm, GRID)  # (seed, block)
    gmm = mk.mask_locality(torch.stack(list(mk.learned_masks(gmm).values())), GRID)
    correlation, extroversion = elm.correlation, elm.extroversion
    expect(correlation.min() > -0.25 and gmm.correlation.min() < -0.9,
           "no ELM mask is local: the correlation of mask value with patch distance stays small, "
           "while a local mask, as the GMM-ViT's head masks, is strongly negative")  # fmt: skip
    expect(bool((correlation.argmax(1) == 2).all()), "no shallow-local / deep-global trend: "
           "block 2, not the last, is the least local in every seed")  # fmt: skip
    expect(extroversion.abs().max() <= 0.11, "extroversion is within +-0.11 everywhere")
    return {
        "correlation": {"min": f"{correlation.min():+.2f}", "max": f"{correlation.max():+.2f}"},
        "gmm_correlation_min": fixed(gmm.correlation.min().item(), 3),
        "masks": extroversion.numel(),
        "extroverted": int((extroversion > 0).sum()),
    }


def _fig4(elm) -> dict:
    """Fig. 4: two Gaussians fitted to each block's mask of the seed-0 ELM-ViT."""
    fits = [mk.fit_gaussian_mixture(m[0], GRID, num_kernels=2, restarts=4)
            for m in mk.learned_masks(elm).values()]  # fmt: skip
    radial = [fit.r2_radial for fit in fits]
    expect(max(radial) < 0.25, "no function of distance explains much of any mask's variance")
    narrow = any(((fit.alpha < 0) & (fit.sigma < 0.5)).any() for fit in fits)
    expect(not narrow, "no fit has the paper's extroversion component (alpha < 0, sigma < 0.5)")
    return {
        "r2_radial": [percent(r, 0) for r in radial],
        "r2_radial_max": percent(max(radial), 0),
        "r2_max": fixed(max(fit.r2 for fit in fits)),
    }


def _kernels(gmm, card: dict) -> dict:
    """The seed-0 GMM-ViT's kernels: their change from the initialisation (rebuilt from the
    recipe's seed, as the trainer builds it) and what each does on the 8 x 8 grid."""
    with torch.random.fork_rng():
        torch.manual_seed(card["recipe"]["seed"])
        start = mk.gmm_parameters(vk.create_model(card["architecture"], **card["kwargs"]))
    trained = mk.gmm_parameters(gmm)
    alpha, sigma = (torch.stack([p[key] for p in trained.values()]) for key in ("alpha", "sigma"))
    change = {key: torch.cat([(trained[n][key] - start[n][key]).abs() for n in trained])
              .mean().item() for key in ("alpha", "sigma")}  # fmt: skip
    expect(change["alpha"] < 2 / 4 and change["sigma"] < 10 / 4, "the kernels moved little from "
           "their random initialisation (under a quarter of the spread: 2, 10)")  # fmt: skip
    flat, diagonal = sigma.abs() >= FLAT, sigma.abs() < DIAGONAL
    shaped, level = ~flat & ~diagonal, alpha.sum(1)  # level: (block, head)
    return {
        "change": {"alpha": fixed(change["alpha"]), "sigma": fixed(change["sigma"], 1)},
        "kernels": alpha.numel(),
        "flat": int(flat.sum()),
        "local": int((shaped & (alpha > 0)).sum()),
        "far": int((shaped & (alpha < 0)).sum()),
        "diagonal": int(diagonal.sum()),
        "heads": level.numel(),
        "inverted_heads": int((level < 0).sum()),
    }


def _fig7(models: dict, images, objects) -> dict:
    """Fig. 7: the attention each patch receives in the last block, scored against the objects;
    attention statistics per block; the scale of the scores and the field each mask implies."""
    results = {key: vk.attention(model, images) for key, model in models.items()}
    received = {key: result.received()[-1] for key, result in results.items()}
    energy = {k: vk.metrics.energy_in_mask(m, objects).mean().item() for k, m in received.items()}
    hits = {k: vk.metrics.pointing_game(m, objects).float().mean().item()
            for k, m in received.items()}  # fmt: skip
    one = 1 / len(objects)  # a near tie of one image's peak may move a pointing game by one
    expect(energy["gmm"] < energy["vit"] and hits["gmm"] <= hits["vit"] + one,
           "the GMM's maps are not more object-centred than the ViT's")  # fmt: skip

    stats = {key: result.stats() for key, result in results.items()}
    distance = {k: s["distance_patches"].mean((1, 2)) for k, s in stats.items()}
    itself = {k: s["self_mass"].mean((1, 2)) for k, s in stats.items()}
    uniform = mk.mask_receptive_field(torch.zeros(64, 64), GRID).item()
    expect(bool((distance["gmm"] < distance["vit"]).all() and (distance["vit"] < distance["elm"])
                .all()), "in every block the GMM-ViT's attention is more local than the ViT's "
           "and the ELM-ViT's less")  # fmt: skip
    expect(itself["elm"].max() < UNIFORM_SELF, "the ELM-ViT's attention to itself is below "
           "uniform in every block")  # fmt: skip
    expect(all(((UNIFORM_SELF / 2 < itself[k]) & (itself[k] < 2 * UNIFORM_SELF)).all()
               for k in ("vit", "gmm")), "the ViT's and GMM-ViT's attention to itself is within "
           "a factor 2 of uniform")  # fmt: skip

    scale = {key: _score_scale(models[key], images) for key in ("elm", "gmm")}
    elm_std, gmm_std = scale["elm"]["std"], scale["gmm"]["std"]
    expect(max(elm_std) < 1.1 * min(elm_std) and min(elm_std) > 10 * max(gmm_std),
           "the ELM-ViT's scores grew to about one scale in every block, far above the "
           "GMM-ViT's")  # fmt: skip
    expect(all(abs(f - uniform) < 0.4 for f in scale["elm"]["field"]),
           "alone at that scale each ELM mask would attend close to uniformly")  # fmt: skip
    return {
        "object_area": fixed(objects.float().mean().item()),
        "energy": {key: fixed(value) for key, value in energy.items()},
        "pointing": {key: percent(value) for key, value in hits.items()},
        "distance": {key: _span(value.tolist()) for key, value in distance.items()},
        "uniform_distance": fixed(uniform),
        "self_mass": {
            "all": _span(torch.cat(list(itself.values())).tolist(), 3),
            "elm": _span(itself["elm"].tolist(), 3),
        },
        "score_std": {"elm": fixed(sum(elm_std) / len(elm_std), 0), "gmm": _span(gmm_std, 1)},
        "elm_field": _span(scale["elm"]["field"], 1),
    }


def _score_scale(model, images) -> dict[str, list[float]]:
    """Per block: the std of the scores q.k / sqrt(d) on the images, and the mean attention
    distance of softmax(std x mask), the field the mask implies on its own (heads averaged)."""
    _, scores = vk.HookedModel(model).run_with_cache(images, names="blocks.*.attn.hook_scores")
    masks = mk.learned_masks(model)
    std = [scores[f"{name}.hook_scores"].std().item() for name in masks]
    field = [mk.mask_receptive_field(mask, GRID, logit=s).mean().item()
             for mask, s in zip(masks.values(), std, strict=True)]  # fmt: skip
    return {"std": std, "field": field}


def _accuracy() -> dict:
    """Test accuracy (%) over seeds 0-2 of every mask the tiny model was trained with (one
    recipe): the learned ELM and GMM, the GMM frozen at its initialisation, and the decays the
    paper starts from."""
    runs = {key: [100 * vk.zoo.card(f"{prefix}_s{seed}")["test_accuracy"] for seed in range(3)]
            for key, prefix in ACCURACY_RUNS.items()}  # fmt: skip
    mean = {key: statistics.mean(v) for key, v in runs.items()}
    std = {key: statistics.stdev(v) for key, v in runs.items()}
    expect(max(mean, key=mean.get) == "local", "the fixed 3 x 3 window is the most accurate mask")
    expect(mean["retnet"] > mean["vit"], "RetNet's causal decay beats the ViT")
    expect(
        max(std, key=std.get) in ("rmt", "rmt_learn"),
        "RMT's decay (gamma fixed or learned) varies most from seed to seed",
    )
    expect(all(abs(mean[f"{decay}_learn"] - mean[decay]) < 1 for decay in ("retnet", "rmt")),
           "learning gamma moves neither decay's mean accuracy by a point")  # fmt: skip
    expect(mean["vit"] < mean["gmm_frozen"] < mean["gmm"],
           "the frozen GMM lies between the ViT and the learned GMM")  # fmt: skip
    return {key: f"{mean[key]:.2f} ± {std[key]:.2f}" for key in runs}


def _params() -> dict:
    """Tables 3-6: every parameter count the paper prints, against the registered models; the
    masks' cost on the tiny model."""
    reproduced = sum(mk.masked_vit_params(name, **kwargs) == paper
                     for _, name, kwargs, paper in mk.PAPER_COUNTS)  # fmt: skip
    expect(reproduced == len(mk.PAPER_COUNTS), "all the counts of Tables 3-6 are reproduced")
    tiny = {mask: mk.masked_vit_params(f"vizkit_{mask}_vit_tiny") for mask in ("gap", "elm", "gmm")}
    shared = mk.masked_vit_params("vizkit_gmm_vit_tiny", share_heads=True) - tiny["gap"]
    base = tiny["gap"]
    gmm, elm = tiny["gmm"] - base, tiny["elm"] - base
    expect(gmm == 2 * 5 * 4 * 4 and shared == 2 * 5 * 4 and elm == 64**2 * 4, "the GMM costs "
           "2 x 5 x 4 heads x 4 blocks (2 x 5 x 4 head-shared), the ELM 64² per block")  # fmt: skip
    gammas = (mk.masked_vit_params("vizkit_retnet_vit_tiny", learnable_gamma=True)
              - mk.masked_vit_params("vizkit_retnet_vit_tiny"))  # fmt: skip
    expect(gammas == 4 * 4, "a learned decay costs one gamma per head and block")
    return {
        "counts": len(mk.PAPER_COUNTS),
        "reproduced": reproduced,
        "tiny": {"gmm": f"{gmm:,d}", "gmm_shared": f"{shared:,d}", "elm": f"{elm:,d}",
                 "elm_share": percent(elm / base, 0), "baseline": f"{base / 1e3:.0f}k",
                 "gammas": f"{gammas:,d}"},
    }  # fmt: skip


def _span(values: list[float], digits: int = 2) -> str:
    """``[3.91, 3.73, 3.88]`` -> ``"3.73-3.91"``."""
    return f"{fixed(min(values), digits)}-{fixed(max(values), digits)}"
