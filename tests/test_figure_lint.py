"""Figure lint over every public figure builder, every explorer and every report section of the
core zoo and of one model per paper. Each figure has a title; square maps have square cells in
every subplot (not only the first); colour carries a value only with a colour bar; curves and
bars have axis titles; accuracy reads in percent; log axes are ticked in full numbers; class
names, not numbers, where the data has names; no label contradicts the model (LayerScale
where there is none); no annotation (subplot titles) under 12 px; and a colour bar of attention
weights starts at 0 (so that panels and figures compare)."""

from __future__ import annotations

import re
from functools import cache

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import vizkit as vk
from vizkit.analysis.residual_norms import layerscale_gammas
from vizkit.papers.masks import analysis as mk
from vizkit.papers.sot import analysis as sot
from vizkit.registers.planted import PLANTED_NEURON, bright_patch_images, planted_register_vit
from vizkit.report.inputs import load_inputs
from vizkit.report.sections import SECTIONS, NotApplicable

GRID = (8, 8)  # the Shapes models' patch grid (32 px, patch 4)
MIN_FONT = 12  # px, the smallest legible text (subplot titles of 10-11 px were too small)


def faults(fig: go.Figure) -> list[str]:
    """What is wrong with ``fig`` by the rules above (empty: nothing)."""
    found = []
    if not (fig.layout.title.text or "").strip():
        found.append("no title")
    with_image = {(t.xaxis or "x", t.yaxis or "y") for t in fig.data if isinstance(t, go.Image)}
    for trace in fig.data:  # plotly keeps an image's pixels square (and a map laid over it)
        x, y = trace.xaxis or "x", trace.yaxis or "y"
        if _is_square_map(trace) and (x, y) not in with_image:
            if fig.layout["yaxis" + y[1:]].scaleanchor != x:
                found.append(f"cells not square on {y}")
    heatmaps = [t for t in fig.data if isinstance(t, go.Heatmap)]
    shared = [t for t in heatmaps if t.coloraxis]
    own = [t for t in heatmaps if not t.coloraxis]
    if shared and fig.layout.coloraxis.showscale is False:
        found.append("no colour bar")
    if own and all(t.showscale is False for t in own):
        found.append("no colour bar")
    axes = {k: fig.layout[k] for k in fig.layout if re.fullmatch(r"[xy]axis\d*", k)}
    on_maps = {(t.xaxis, t.yaxis) for t in fig.data if isinstance(t, go.Heatmap | go.Image)}
    plots = [t for t in fig.data if isinstance(t, go.Bar | go.Scatter)
             and (t.xaxis, t.yaxis) not in on_maps]  # not a marker drawn on a map  # fmt: skip
    lines = [t for t in plots if isinstance(t, go.Scatter) and t.mode != "markers"]
    if plots:
        if not any(a.title.text for k, a in axes.items() if k.startswith("y")):
            found.append("curves or bars without a y-axis title")
    if lines and not any(a.title.text for k, a in axes.items() if k.startswith("x")):
        found.append("curves without an x-axis title")
    for key, axis in axes.items():
        if axis.type == "log" and axis.tickvals is None:
            found.append(f"{key} is logarithmic with plotly's abbreviated tick digits")
        title = (axis.title.text or "").lower()
        if "accuracy" in title and "%" not in title and "%" not in (axis.tickformat or ""):
            found.append(f"{key} shows accuracy, not in percent")
    named = [t for t in lines if t.showlegend is not False]
    if len(named) > 1 and any(not t.name for t in named):
        found.append("several curves, some without a legend name")
    for text in _texts(fig):
        if re.search(r"\bclass \d+\b", text):
            found.append(f"a class number where the data has names: {text!r}")
    for note in fig.layout.annotations or ():
        if note.font.size is not None and note.font.size < MIN_FONT:
            found.append(f"{note.font.size} px text: {note.text!r}")
    for bar, low, values in _colour_bars(fig):
        if bar.lower().startswith("weight") and np.nanmin(values) >= 0 and low != 0:
            found.append(f"colour bar {bar!r} of weights (all >= 0) does not start at 0")
    return found


def _colour_bars(fig: go.Figure):
    """(title, the fixed lower end or None where plotly picks it, every value) of each colour
    bar: a heatmap's own, or a colour axis shared by heatmaps. Plotly fixes the range only where
    both ends are given."""
    heatmaps = [t for t in fig.data if isinstance(t, go.Heatmap) and t.z is not None]
    for t in (t for t in heatmaps if not t.coloraxis):
        fixed = None not in (t.zmin, t.zmax) and t.zauto is not True
        yield t.colorbar.title.text or "", t.zmin if fixed else None, _values([t])
    for name in {t.coloraxis for t in heatmaps if t.coloraxis}:
        axis, shared = fig.layout[name], [t for t in heatmaps if t.coloraxis == name]
        fixed = None not in (axis.cmin, axis.cmax) and axis.cauto is not True
        yield axis.colorbar.title.text or "", axis.cmin if fixed else None, _values(shared)


def _values(heatmaps) -> np.ndarray:
    return np.concatenate([np.asarray(t.z, dtype=float).ravel() for t in heatmaps])


def _is_square_map(trace) -> bool:
    """A heatmap whose grid is square (a patch map, a CKA matrix, a mask)."""
    if not isinstance(trace, go.Heatmap) or trace.z is None:
        return False
    rows = len(trace.z)
    return rows > 1 and rows == len(trace.z[0])


def _texts(fig: go.Figure) -> list[str]:
    axes = [fig.layout[k].title.text for k in fig.layout if re.fullmatch(r"[xy]axis\d*", k)]
    notes = [a.text for a in fig.layout.annotations or ()]
    return [t for t in [fig.layout.title.text, *axes, *notes] if t]


# ---- inputs: the committed sample and shipped models, loaded once ----------------------------


@cache
def sample():
    images, labels, masks = vk.datasets.load_sample()
    return images[:4], labels[:4], masks[:4]


@cache
def zoo(name: str):
    return vk.zoo.load(name)


def model(name: str):
    return zoo(name)[0]


def history(name: str) -> list[dict]:
    return zoo(name)[1]["history"]


VIT = "vit_tiny_shapes"
DEEP = ("vit_deep_shapes", "vit_deep_layerscale_shapes")  # without and with LayerScale
PATCHED = ("resid", "positions", "heads", "attn", "mlp")  # all four panels of patching_maps


def shown(name: str = "vit_tiny_shapes"):
    return vk.viz.display_images(sample()[0], zoo(name)[0])


@cache
def clips() -> tuple[torch.Tensor, torch.Tensor]:
    """Four Shape clips of the planted task and their labels."""
    from vizkit.datasets.shape_clips import ShapeClips

    data = ShapeClips("test", n=4)
    return torch.stack([data[i][0] for i in range(4)]), data.labels


def depth_target():
    """What a depth model's map explains: one box's mean depth less another's (32 px images)."""
    near, far = (vk.targets.box_mask(box, (32, 32)) for box in ((2, 2, 10, 10), (18, 16, 12, 14)))
    return vk.targets.depth_difference(near, far)


@cache
def depth_saliency():
    """The input gradient of `depth_target` on a small random-init DPT, and the images shown."""
    import transformers

    torch.manual_seed(0)
    config = transformers.DPTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, backbone_out_indices=[0, 1], neck_hidden_sizes=[8, 16],
        fusion_hidden_size=16, reassemble_factors=[4, 2],
    )  # fmt: skip
    depth = transformers.DPTForDepthEstimation(config).eval()
    images = sample()[0]
    result = vk.saliency(depth, images, target=depth_target())
    return result, vk.viz.display_images(images, depth, mean=(0.5,) * 3, std=(0.5,) * 3)


def classes(name: str = "vit_tiny_shapes") -> list[str]:
    return zoo(name)[1]["classes"]


@cache
def vit_attention():
    return vk.attention(zoo("vit_tiny_shapes")[0], sample()[0])


@cache
def sanity_results():
    return [
        vk.sanity_check(model("vit_tiny_shapes"), sample()[0], m, progress=False)
        for m in ("gradcam", "random")
    ]


@cache
def elm_masks():
    return {n: m[0] for n, m in mk.learned_masks(zoo("masks_elm_s0")[0]).items()}


@cache
def refiner_stages():
    return vk.papers.refiner.refiner_stages(zoo("refined_vit_shapes")[0], sample()[0], layer=3)


@cache
def evolution():
    return vk.feature_evolution(zoo("vit_tiny_shapes")[0], sample()[0], progress=False)


@cache
def anatomy():
    return sot.head_anatomy(zoo("sot_sum_s0")[0], sample()[0])


@cache
def gradcam():
    images, labels, _ = sample()
    return vk.gradcam(zoo("vit_tiny_shapes")[0], images, target=labels)


def probabilities(name: str = "vit_tiny_shapes"):
    with torch.no_grad():
        return zoo(name)[0](sample()[0]).softmax(-1)


def predicted(name: str = "vit_tiny_shapes"):
    with torch.no_grad():
        return vk.metrics.predictions(zoo(name)[0](sample()[0]), sample()[1], classes())


def fig7():
    model = zoo("cait_tiny_shapes")[0]
    images = sample()[0]
    cfg = model.pretrained_cfg
    gray = vk.papers.cait.modulated_gray(
        vk.class_attention(model, images), images, cfg["mean"], cfg["std"]
    )
    return vk.papers.cait.fig7_gallery(
        gray, probabilities("cait_tiny_shapes"), classes("cait_tiny_shapes")
    )


def gaussian_fit():
    name, mask = next(iter(elm_masks().items()))
    fit = mk.fit_gaussian_mixture(mask, GRID, num_kernels=2, restarts=1)
    return vk.papers.masks.gaussian_fit_figure(
        mask, fit, GRID, f"ELM-ViT {name}: two Gaussians fitted"
    )


def compare_table():
    images, labels, masks = sample()
    model = zoo("vit_tiny_shapes")[0]
    return vk.metrics.compare_saliency(
        model, images, methods=["rollout", "gradcam"], masks=masks, target=labels
    )


BUILDERS = {
    "attention_grid": lambda: [
        vk.viz.attention_grid(vit_attention(), images=shown()),
        vk.viz.attention_grid(vit_attention(), query=(2, 3), scale="per_panel"),
    ],
    "query_attention": lambda: vk.viz.query_attention(vit_attention(), shown(), query=(2, 3)),
    "attention_stats_figure": lambda: vk.viz.attention_stats_figure(vit_attention()),
    "class_attention_heads": lambda: vk.papers.cait.class_attention_heads(
        [vk.class_attention(zoo("cait_tiny_shapes")[0], sample()[0], layer=j) for j in (0, 1)],
        shown("cait_tiny_shapes"),
    ),
    "fig7_gallery": fig7,
    "talking_heads_matrices": lambda: vk.papers.cait.talking_heads_matrices(
        vk.papers.cait.talking_heads(zoo("cait_tiny_shapes")[0])
    ),
    "layerscale_heatmap": lambda: vk.viz.layerscale_heatmap(
        vk.analysis.layerscale(zoo("cait_tiny_shapes")[0])
    ),
    "residual_ratio_curves": lambda: [
        vk.viz.residual_ratio_curves(
            vk.train.tracked_results(zoo("vit_deep_shapes")[1]["history"], "residual_ratios")
        ),
        vk.viz.residual_ratio_curves(
            {
                n: vk.residual_ratios(zoo(n)[0], sample()[0])
                for n in ("vit_deep_shapes", "vit_deep_layerscale_shapes")
            }
        ),
    ],  # fmt: skip
    "cka_heatmap": lambda: vk.viz.cka_heatmap(evolution().cka),
    "feature_evolution_curves": lambda: vk.viz.feature_evolution_curves({"ViT": evolution()}),
    "predictions_figure": lambda: vk.viz.predictions_figure(shown(), predicted()),
    "saliency_overlay": lambda: [
        vk.viz.saliency_overlay(gradcam(), shown(), classes=classes()),
        vk.viz.saliency_overlay(gradcam(), shown(), 1, classes(), region=sample()[2]),
        vk.viz.saliency_overlay(*depth_saliency(), 0, region=depth_target()),
    ],
    "sanity_maps": lambda: vk.viz.sanity_maps(sanity_results()[0], shown()),
    "sanity_curves": lambda: vk.viz.sanity_curves(sanity_results()),
    "evaluation_bars": lambda: vk.viz.evaluation_bars(
        vk.evaluate(model("vit_tiny_shapes"), sample(), ["gradcam", "random"], progress=False)
    ),
    "logit_attribution_figure": lambda: vk.viz.logit_attribution_figure(
        vk.direct_logit_attribution(model("vit_tiny_shapes"), sample()[0], target=sample()[1]),
        classes=classes(),
    ),
    "logit_lens_maps": lambda: vk.viz.logit_lens_maps(
        vk.logit_lens(model("vit_tiny_shapes"), sample()[0]), shown(), classes=classes()
    ),
    "patching_maps": lambda: vk.viz.patching_maps(
        vk.activation_patching(
            model(VIT), sample()[0], sample()[0].flip(0), sites=PATCHED, progress=False
        )
    ),
    "circuit_figure": lambda: [
        vk.viz.circuit_figure(
            vk.attribution_patching(
                model("vit_tiny_shapes"),
                sample()[0],
                sample()[0].flip(0),
                target=sample()[1],
                progress=False,
            )  # fmt: skip
        ),
        vk.viz.circuit_figure(
            vk.circuits.acdc(
                vk.circuits.planted_circuit_vit(),
                *vk.circuits.planted_images(4)[::2],
                progress=False,
            )
        ),  # fmt: skip
    ],
    "faithfulness_figure": lambda: vk.viz.faithfulness_figure(
        {
            "EAP-IG": vk.circuits.faithfulness(
                vk.circuits.planted_circuit_vit(),
                vk.attribution_patching(
                    vk.circuits.planted_circuit_vit(),
                    *vk.circuits.planted_images(4)[::2],
                    progress=False,
                ),
                *vk.circuits.planted_images(4)[::2],
                progress=False,
            )
        }
    ),  # fmt: skip
    "curve_comparison": lambda: vk.viz.curve_comparison(
        {
            name: vk.metrics.road(model("vit_tiny_shapes"), sample()[0], maps, sample()[1])
            for name, maps in (("gradcam", gradcam()), ("random", torch.rand(4, 32, 32)))
        }
    ),  # fmt: skip
    "saliency_row": lambda: [
        vk.viz.saliency_row(gradcam(), shown(), classes=classes()),
        vk.viz.saliency_row(*depth_saliency(), region=depth_target()),
    ],
    "video_saliency": lambda: [
        vk.viz.video_saliency(
            method(model("vivit_shape_clips"), clips()[0], **options),
            vk.viz.display_images(clips()[0], model("vivit_shape_clips")),
            clip=1,
            classes=classes("vivit_shape_clips"),
        )
        for method, options in ((vk.rollout, {}), (vk.attnlrp, {"target": clips()[1]}))
    ],  # fmt: skip
    "saliency_side_by_side": lambda: [
        vk.viz.saliency_side_by_side(compare_table(), shown(), classes=classes()),
        vk.viz.saliency_side_by_side(compare_table(), shown(), 2, classes(), sample()[2]),
    ],
    "mask_figure": lambda: vk.papers.masks.mask_figure(
        next(iter(elm_masks().values())), GRID, (3, 3)
    ),
    "mask_layers_figure": lambda: vk.papers.masks.mask_layers_figure(
        elm_masks(), GRID, "ELM masks"
    ),
    "masks_as_kernels_figure": lambda: vk.papers.masks.masks_as_kernels_figure(
        {
            "RetNet": vk.papers.masks.DecayMask(4, "causal")(GRID)[0],
            "RMT": vk.papers.masks.DecayMask(4)(GRID)[0],
            "local": vk.papers.masks.LocalMask(1)(GRID)[0],
            "ELM": next(iter(elm_masks().values())),
        },
        GRID,
    ),  # fmt: skip
    "radial_profiles_figure": lambda: vk.papers.masks.radial_profiles_figure(
        {"ELM": elm_masks()}, GRID, "Mean mask value against distance"
    ),
    "gaussian_fit_figure": gaussian_fit,
    "gmm_parameters_figure": lambda: vk.papers.masks.gmm_parameters_figure(
        zoo("masks_gmm_k3_s0")[1]["history"], "GMM kernels per epoch"
    ),
    "mask_evolution_figure": lambda: vk.papers.masks.mask_evolution_figure(
        mk.gmm_masks_over_training(zoo("masks_gmm_k3_s0")[1]["history"], GRID)["blocks.0.attn"],
        GRID,
    ),
    "received_attention_figure": lambda: vk.papers.masks.received_attention_figure(
        shown(), {"ViT": vit_attention().received()[-1]}, count=2
    ),
    "accuracy_vs_kernels_figure": lambda: vk.papers.masks.accuracy_vs_kernels_figure(
        {k: vk.ledger.accuracy_over_seeds(f"masks_gmm_k{k}") for k in (1, 3, 5)},
        {1: 75.54, 3: 77.12, 5: 77.81},
    ),
    "accuracy_over_seeds_figure": lambda: vk.viz.accuracy_over_seeds_figure(
        {"ELM": vk.ledger.accuracy_over_seeds("masks_elm")}, "Test accuracy over 3 seeds"
    ),
    "scale_trend": lambda: vk.viz.scale_trend(
        [
            {"budget": "40 epochs", "value": -3.2, "two_se": 1.2, "verdict": "not held"},
            {"budget": "80 epochs", "value": -1.0, "two_se": 1.5, "verdict": "inconclusive"},
        ],
        "WordT minus ClassT on Digits",
    ),  # fmt: skip
    "refiner_stages_figure": lambda: vk.papers.refiner.refiner_stages_figure(refiner_stages()),
    "refiner_weights_figure": lambda: vk.papers.refiner.refiner_weights_figure(refiner_stages()),
    "attention_matrices": lambda: vk.papers.refiner.attention_matrices(
        {
            "ViT": vit_attention(),
            "Refined-ViT": vk.attention(zoo("refined_vit_shapes")[0], sample()[0]),
        },
        layers=[0, 2],
    ),  # fmt: skip
    "attention_depth_curves": lambda: vk.papers.refiner.attention_depth_curves(
        {"ViT": vit_attention().stats()}
    ),
    "crop_ratio_curves": lambda: vk.papers.refiner.crop_ratio_curves(
        {
            "ViT": vk.papers.refiner.crop_ratio_accuracy(
                zoo("vit_tiny_shapes")[0],
                vk.datasets.Shapes("test", n=16),
                (0.8, 1.0),
                progress=False,
            )
        }
    ),  # fmt: skip
    "cross_covariance_figure": lambda: vk.papers.sot.cross_covariance_figure(anatomy()),
    "svpn_spectrum_figure": lambda: vk.papers.sot.svpn_spectrum_figure(anatomy()),
    "branch_logits_figure": lambda: vk.papers.sot.branch_logits_figure(
        anatomy(), classes=vk.datasets.SHAPE_CLASSES
    ),
    "maps_grid": lambda: vk.papers.sot.maps_grid(shown(), {"Grad-CAM": gradcam()}, [0, 1]),
    "token_pca_figure": lambda: [
        vk.viz.token_pca_figure(vk.token_pca(model(VIT), sample()[0]), shown()),
        vk.viz.token_pca_figure(
            vk.token_pca(model(VIT), sample()[0], components=4), count=2, components=(1, 2, 3)
        ),
    ],  # fmt: skip
    "token_norms_figure": lambda: [
        vk.viz.token_norms_figure(vk.token_norms(model(VIT), sample()[0]), shown()),
        vk.viz.token_norms_figure(vk.token_norms(model(VIT), sample()[0]), layer=0, count=2),
    ],
    "register_effect_figure": lambda: [
        vk.viz.register_effect_figure(register_effect(), vk.viz.display_images(planted()[1])),
        vk.viz.register_effect_figure(register_effect(), count=1),
    ],
    "training_curves": lambda: vk.viz.training_curves(zoo("vit_tiny_shapes")[1]["history"]),
    "conditioned_maps_figure": lambda: [
        vk.viz.conditioned_maps_figure(
            vk.concepts.conditioned_maps(
                model("vit_tiny_shapes"), sample()[0][:2], None, shapes_sae(), chosen=[0, 1, 2]
            ),
            vk.viz.display_images(sample()[0][:2], model("vit_tiny_shapes")),
            {0: "circle (IoU 0.21)", 2: "ring (IoU 0.08)"},
            scale=scale,
        )
        for scale in ("shared", "each")
    ],
    "latent_maps_figure": lambda: vk.viz.latent_maps_figure(
        vk.sae.latent_maps(zoo("vit_tiny_shapes")[0], shapes_sae(), sample()[0], [0, 1]),
        vk.viz.display_images(sample()[0], zoo("vit_tiny_shapes")[0]),
        [0, 1],
        "blocks.2.hook_resid_post",
        ["raises circle", "raises ring"],
    ),
    "epoch_accuracy_curves": lambda: vk.viz.epoch_accuracy_curves(
        {"ViT": zoo("vit_tiny_shapes")[1]["history"]}, "Test accuracy per epoch"
    ),
}
NOT_FIGURES = {"display_images", "folded_mask", "heatmap_on_image", "use_exportable_figures"}

EXPLORERS = {
    "AttentionExplorer": lambda: vk.widgets.AttentionExplorer(model(VIT), sample()[0]),
    "CKAExplorer": lambda: vk.widgets.CKAExplorer({"ViT": evolution()}),
    "HistoryExplorer": lambda: vk.widgets.HistoryExplorer(zoo("vit_tiny_shapes")[1]),
    "LayerScaleExplorer": lambda: vk.papers.cait.LayerScaleExplorer(sample()[0], 4, (0.1, 1.0)),
    "RefinerExplorer": lambda: vk.papers.refiner.RefinerExplorer(
        model("refined_vit_shapes"), sample()[0]
    ),
    "SaliencyComparer": lambda: vk.widgets.SaliencyComparer(
        zoo("vit_tiny_shapes")[0], sample()[0], sample()[2], methods=["rollout"]
    ),
    "MechanisticExplorer": lambda: vk.widgets.MechanisticExplorer(
        zoo("vit_tiny_shapes")[0], sample()[0][:2], classes=classes()
    ),
    "FeatureBrowser": lambda: vk.widgets.FeatureBrowser(
        zoo("vit_tiny_shapes")[0], shapes_sae(), vk.datasets.load_sample()[0], classes=classes()
    ),
    "HeadExplorer": lambda: head_explorer(),
    "CircuitExplorer": lambda: circuit_explorer(),
}  # fmt: skip


def circuit_explorer() -> vk.widgets.CircuitExplorer:
    """The Shapes ViT's circuit telling circles from rings (each circle, a ring in its place)."""
    clean, ring, labels, _ = vk.datasets.counterfactual_shapes(40, replace=3)
    circles = labels == 0
    return vk.widgets.CircuitExplorer(zoo("vit_tiny_shapes")[0], clean[circles][:4],
                                      ring[circles][:4], target=0, versus=3,
                                      classes=classes())  # fmt: skip


@cache
def planted() -> tuple:
    """The ViT with a planted register neuron, and four images that trigger it."""
    return planted_register_vit(), bright_patch_images(4)[0]


@cache
def register_effect() -> vk.registers.RegisterEffect:
    neurons = {PLANTED_NEURON[0]: [PLANTED_NEURON[1]]}
    return vk.registers.register_effect(*planted(), neurons, steps=2)


def head_explorer() -> vk.widgets.HeadExplorer:
    """The zoo's text-image model's heads, described over the Shapes sample."""
    from vizkit.datasets.captions import WordTokenizer, descriptions

    model, card = zoo("clip_shapes")
    tokenizer = WordTokenizer.from_dict(card["tokenizer"])
    images = vk.datasets.load_sample()[0]
    span = vk.text_span(model, images, descriptions(), tokenizer, basis=3, progress=False)
    texts = vk.targets.encode_texts(model, [f"a {c}" for c in card["classes"]], tokenizer)
    return vk.widgets.HeadExplorer(model, span, images, texts, card["classes"])


@cache
def shapes_sae() -> vk.sae.SparseAutoencoder:
    """A small autoencoder of the shipped ViT's second-to-last block, on the Shapes sample."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="vizkit-lint-sae-")
    store = vk.cache_activations(zoo("vit_tiny_shapes")[0], "shapes", f"{folder}/store",
                                 layers=[-2], tokens="all", progress=False)  # fmt: skip
    return vk.train_sae(store, expansion=2, k=8, tokens=5 * len(store), batch_size=256,
                        progress=False)  # fmt: skip


def test_every_public_figure_builder_and_explorer_is_linted():
    papers = [getattr(vk.papers, name) for name in vk.papers.__all__]
    builders = set(vk.viz.__all__).union(*(p.figures.__all__ for p in papers)) - NOT_FIGURES
    assert builders == set(BUILDERS), "add the new builder to BUILDERS"
    explorers = {n for n in vk.widgets.__all__ if n[0].isupper()}
    explorers |= {n for p in papers for n in p.__all__ if n.endswith("Explorer")}
    assert explorers == set(EXPLORERS), "add the new explorer to EXPLORERS"


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_builder_lint(name):
    built = BUILDERS[name]()
    for fig in built if isinstance(built, list) else [built]:
        assert faults(fig) == []


@pytest.mark.parametrize("name", sorted(EXPLORERS))
def test_explorer_lint(name):
    explorer = EXPLORERS[name]()
    assert faults(explorer.static()) == []


# ---- the report ---------------------------------------------------------------------------

REPORTED = ["vit_tiny_shapes", "cait_tiny_shapes", "resnet_tiny_shapes", "vit_tiny_digits",
            "refined_vit_shapes", "masks_gmm_k3_s0", "sot_sum_s0"]  # fmt: skip


def _gammas(model):
    """Each block's LayerScale gammas (None where the block has none)."""
    blocks = [n for n, _ in model.named_modules() if re.fullmatch(r"blocks(_token_only)?\.\d+", n)]
    return [g for n in blocks for g in layerscale_gammas(model, n)]


@cache
def report_figures(model: str) -> tuple[tuple[str, go.Figure], ...]:
    inputs = load_inputs(model, n=2)
    figures = []
    for name, build in SECTIONS.items():
        try:
            section = build(inputs)
        except NotApplicable:
            continue
        figures += [(f"{name}[{i}]", fig) for i, fig in enumerate(section.figures)]
    return tuple(figures)


@pytest.mark.parametrize("model", REPORTED)
def test_report_lint(model):
    layerscale = any(gamma is not None for gamma in _gammas(zoo(model)[0]))
    found = {}
    for name, fig in report_figures(model):
        problems = faults(fig)
        if not layerscale and any("with LayerScale" in t for t in _texts(fig)):
            problems.append("'with LayerScale' for a model without it")
        if problems:
            found[name] = problems
    assert found == {}


def test_the_lint_sees_every_kind_of_section():
    names = {n.split("[")[0] for m in ("vit_tiny_shapes", "cait_tiny_shapes")
             for n, _ in report_figures(m)}  # fmt: skip
    assert {"predictions", "attention", "rollout", "saliency", "representations"} <= names
    assert "residual_ratios" in names and "class_attention" in names
    assert "masks" in {n.split("[")[0] for n, _ in report_figures("masks_gmm_k3_s0")}


@pytest.mark.parametrize(
    "broken, fault",
    [
        (lambda f: f.update_layout(title_text=""), "no title"),
        (lambda f: f.update_yaxes(scaleanchor=None), "cells not square"),
        (lambda f: f.update_traces(showscale=False), "no colour bar"),
    ],
)
def test_the_lint_catches_what_it_names(broken, fault):
    fig = vk.viz.cka_heatmap(evolution().cka)
    assert faults(fig) == []
    assert any(fault in f for f in faults(broken(fig)))
    curves = vk.viz.training_curves(zoo("vit_tiny_shapes")[1]["history"])
    assert any("y-axis" in f for f in faults(curves.update_yaxes(title_text=None)))
    named = go.Figure([go.Scatter(y=[1, 2], name="a"), go.Scatter(y=[2, 1])])
    named.update_layout(title_text="t", xaxis_title="x", yaxis_title="accuracy")
    assert "several curves, some without a legend name" in faults(named)
    assert "yaxis shows accuracy, not in percent" in faults(named)
    assert any("abbreviated" in f for f in faults(curves.update_yaxes(type="log")))
    numbered = go.Figure(layout={"title": {"text": "Grad-CAM, explains class 7"}})
    assert any("class number" in f for f in faults(numbered))
    small = vk.viz.predictions_figure(shown(), predicted())
    assert faults(small) == []
    assert any("10 px text" in f for f in faults(small.update_annotations(font_size=10)))
    row = vk.viz.query_attention(vit_attention(), shown(), query=(2, 3))
    assert faults(row) == []
    heatmap = {"type": "heatmap"}
    assert any("start at 0" in f for f in faults(row.update_traces(zmin=None, selector=heatmap)))
    assert any("start at 0" in f for f in faults(row.update_traces(zmin=0.01, selector=heatmap)))
