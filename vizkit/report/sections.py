"""The sections of a report: each runs one analysis on the inputs and returns its figures, or
says why it does not apply to the model."""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import plotly.graph_objects as go
import torch
from torch import Tensor, nn

from .. import analysis, viz
from ..analysis import SaliencyResult
from ..analysis.saliency_result import constant_maps
from ..hooks import HookedModel
from ..hooks.scores import is_backbone, is_score_target, model_logits, select_images
from ..methods.integrated_gradients import integrated_gradients
from ..methods.registry import default_methods, registered
from ..metrics import compare_saliency, evaluate, near_chance, road, sanity_check
from ..metrics.compare import resolve_methods
from ..metrics.faithfulness import unit_count
from ..metrics.road import ORDERS
from ..targets import embedding_norm
from ..train.history import tracked_results
from .inputs import ReportInputs

__all__ = ["SECTIONS", "NotApplicable", "Section", "add_section"]

# The saliency comparison's quick settings (most of a ViT-S report's time is that comparison):
# on the trained Shapes ViT's 16 sample images they move a method's mean AUC by at most 0.012
# from 16 curve steps and 50 integrated-gradients steps; two methods 0.007 apart swap places
# (python benchmarks/report_settings.py).
CURVE_STEPS = 8
IG_STEPS = 16
# images per backward pass of integrated gradients (interpolated images) and AttnLRP: a pass
# holds every layer's activations, 0.14 GB for 2 ViT-S images (4: 0.30 GB; AttnLRP's batch of
# 8 at once: 0.56 GB), which keeps the report's peak at the attention section's
BACKWARD_IMAGES = 2


@dataclass
class Section:
    """A titled part of the page: an explanation, figures, optional HTML (tables)."""

    title: str
    text: str
    figures: list[go.Figure] = field(default_factory=list)
    html: str = ""


class NotApplicable(Exception):
    """This section does not apply to this model (the message says why)."""


def summary(r: ReportInputs) -> Section:
    hm = r.hooked
    params = sum(p.numel() for p in r.model.parameters())
    layout = hm.token_layout(tuple(r.images.shape[-2:]))
    rows = {
        "model": r.name,
        "architecture": _architecture(r.model, r.card),
        "parameters": f"{params / 1e6:.2f}M",
        "weights": r.card.get("weights", "vizkit zoo (sha256 checked)"),
        "input": f"{r.source}, shape {tuple(r.images.shape)}",
        "hook names": str(len(hm.hook_names())),
    }
    if layout is not None:
        rows["tokens"] = (
            f"{layout.num_prefix_tokens} prefix + {layout.grid[0]}x{layout.grid[1]} patches"
        )
    if "test_accuracy" in r.card:
        rows["test accuracy"] = f"{r.card['test_accuracy']:.2%} on {r.card['data']['name']}"
        rows["training"] = f"{r.card['training_seconds'] / 60:.1f} min, {r.card['trained_on']}"
    return Section("Model", "What was analysed.", html=_table(rows))


def _architecture(model: nn.Module, card: dict) -> str:
    """What the model really is: its class, the timm name it was built from with the kwargs that
    changed it, and (for ViT-like models) depth, width, heads and patch size read off the model."""
    name = card.get("architecture")
    kwargs = card.get("kwargs") or {}
    built = f"{name}({', '.join(f'{k}={v}' for k, v in kwargs.items())})" if kwargs else name
    if card.get("library"):  # a model of another library, behind vizkit's LibraryClassifier
        inner = getattr(model, "model", model)
        return f"{type(inner).__name__} ({card['library']}, {card.get('weights', 'random')})"
    parts = [type(model).__name__ + (f" = timm {built}" if name else "")]
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.Sequential | nn.ModuleList) and hasattr(model, "embed_dim"):
        heads = getattr(getattr(blocks[0], "attn", None), "num_heads", None)
        head_text = f", {heads} heads" if heads else ""
        parts.append(f"{len(blocks)} blocks, width {model.embed_dim}{head_text}")
    pe = getattr(model, "patch_embed", None)
    if pe is not None and getattr(pe, "patch_size", None) is not None:
        (ph, pw), size = pe.patch_size, getattr(pe, "img_size", None)
        parts.append(f"patch {ph}x{pw}" + (f" at {size[0]}x{size[1]}" if size else ""))
    return "; ".join(parts)


def predictions(r: ReportInputs) -> Section:
    _require_classes(r, "there is no predicted class to show")
    with torch.no_grad():
        logits = r.hooked(r.images)
    figure = viz.predictions_figure(
        viz.display_images(r.images, r.model), logits.softmax(-1), r.labels, r.classes
    )
    note = f" Note: {r.class_note}." if r.class_note else ""
    caution = _chance_caution(near_chance(logits), r.card.get("weights") == "random")
    return Section("Predictions", "The model's top class per image." + note, [figure], caution)


def _chance_caution(chance: Tensor, random_weights: bool) -> str:
    """A warning paragraph when predictions are near chance ("" when none is)."""
    flagged = int(chance.sum())
    if not flagged:
        return ""
    why = (
        "the model has random weights"
        if random_weights
        else "the model is untrained, or the images are unlike its training data"
    )
    text = (
        f"⚠ The predictions on {flagged} of {len(chance)} images are near chance (a near-uniform "
        f"softmax, or a top class with a tiny probability): {why}, so no class is predicted "
        "there, and deletion and insertion scores of explanations of those images measure noise."
    )
    return f"<p class='caution'>{html.escape(text)}</p>"


def attention(r: ReportInputs) -> Section:
    result = _attention(r)
    last = result[-1] if isinstance(result, analysis.Stages) else result
    images = viz.display_images(r.images, r.model)
    return Section(
        "Attention",
        "Post-softmax attention of one query (the class token, or the centre patch) in every "
        "layer (of a hierarchical model: of its last stage) and head of image 0, the same "
        "query's head-averaged row over the image, and per-layer statistics over all images "
        "(of every stage, where they fit in memory).",
        [
            viz.attention_grid(last, images=images),
            viz.query_attention(last, images),
            viz.attention_stats_figure(result),
        ],
    )


def rollout(r: ReportInputs) -> Section:
    _require_self_attention(r)
    try:
        result = registered("rollout")(r.hooked, r.images, allow_non_stochastic=True)
    except ValueError as error:
        raise NotApplicable(str(error)) from error
    return _overlays(r, "Attention rollout", "Abnar & Zuidema's rollout of the class token "
                     "where the head reads it (else of the mean patch, or through an "
                     "attention-pooling head) through every layer.", result)  # fmt: skip


def class_attention(r: ReportInputs) -> Section:
    _require_self_attention(r)
    try:
        result = registered("class_attention")(r.hooked, r.images)
    except ValueError as error:
        raise NotApplicable(str(error)) from error
    return _overlays(r, "Class-attention saliency", "The class token's attention over the "
                     "patches (CaiT Fig. 6/7), heads averaged.", result)  # fmt: skip


def saliency(r: ReportInputs) -> Section:
    methods = _report_methods(_has_self_attention(r))
    units = unit_count(r.model, tuple(r.images.shape[-2:]), "patch")
    backbone = is_backbone(r.model)
    table = _quiet(
        lambda: compare_saliency(
            r.hooked, r.images, methods, r.masks, steps=min(CURVE_STEPS, units),
            progress=r.progress, target=embedding_norm() if backbone else None,
        )
    )  # fmt: skip
    explains = (
        " The model is a backbone (embeddings, no classes): every map explains the norm of "
        "each image's embedding (vk.targets.embedding_norm()), and the curves track that norm; "
        "vk.compare_saliency(..., target=vk.targets.similar_to(reference)) explains "
        "similarity instead."
        if backbone
        else ""
    )
    images = viz.display_images(r.images, r.model)
    shown = min(2, len(r.images))
    return Section(
        "Saliency methods compared",
        "The registry's default saliency methods (vizkit.methods.default_methods: Grad-CAM, "
        "AttnLRP, integrated gradients and, where the model has them, the attention-based "
        "maps) side by side, scored by "
        "deletion and insertion AUC (patch level) and, where the data has object masks, by the "
        "pointing game, the energy in the mask and the IoU of a mask-sized top region; the "
        f"table holds means over the {len(r.images)} images (its caption names what was left "
        f"out). For a quick report the curves have {table.options['steps']} steps and "
        f"integrated gradients {IG_STEPS}; vk.compare_saliency(..., steps=16 or 64) scores "
        "finer." + explains,
        [viz.saliency_side_by_side(table, images, i, r.classes) for i in range(shown)],
        html=_breakable(table._repr_html_()),
    )


# what the evaluation section adds to the comparison's deletion, insertion and mask scores
EVALUATION = ("road_morf_auc", "average_drop", "faithfulness_correlation", "sparseness")


def evaluation(r: ReportInputs) -> Section:
    """The sanity check (cascading randomization) of the default methods, and the metrics the
    comparison does not show, with standard errors."""
    _require_classes(
        r,
        "the further faithfulness scores (ROAD, average drop, faithfulness correlation) score "
        "a class's probability; vk.sanity_check(model, x, target=vk.targets.embedding_norm()) "
        "runs the randomization test on it",
    )
    has_attention = _has_self_attention(r)
    names = [n for n in default_methods(has_attention) if n != "integrated_gradients"]
    methods = _report_methods(has_attention)
    checks, refused = [], []
    for name in names:
        try:
            checks.append(_quiet(lambda n=name: sanity_check(r.hooked, r.images, n,
                                                             progress=False)))  # fmt: skip
        except ValueError:  # the method does not apply to this model (rollout on CaiT)
            refused.append(name)
    targets = "labels" if r.labels is not None else "predictions"
    data = (r.images, r.labels if r.labels is not None else _predictions(r))
    table = _quiet(lambda: evaluate(r.hooked, data, methods, list(EVALUATION), batch_size=len(
        r.images), targets=targets, progress=False))  # fmt: skip
    curves = _quiet(lambda: _road_curves(r, methods, data[1]))
    return Section(
        "Can these explanations be trusted?",
        "Above: the model-parameter randomization test (Adebayo et al. 2018): the layers are "
        "re-initialized from the top down, on a copy, and each method's maps compared with the "
        "trained model's (Spearman of |map|); a method whose maps stay the same does not "
        "explain the model (the random baseline is the control). Below: further faithfulness "
        "scores over the same images (ROAD with noisy linear imputation, average drop, "
        "faithfulness correlation) and sparseness, then each method's ROAD curves: the "
        "class's probability as the most (MoRF) or least (LeRF) relevant pixels are removed "
        "and imputed. Integrated gradients is left out of the "
        "randomization test for its cost"
        + (f", and {', '.join(refused)} (which do not apply to this model)" if refused else "")
        + ". vk.sanity_check and vk.evaluate run them on your data.",
        [*([viz.sanity_curves(checks)] if checks else []), viz.evaluation_bars(table),
         *([viz.curve_comparison(curves)] if curves else [])],
    )  # fmt: skip


def _road_curves(r: ReportInputs, methods: list, targets: Tensor) -> dict:
    """Each method's ROAD MoRF and LeRF curves on the report's images whose map is not
    constant (as the evaluation, which leaves those unscored; the name says how many); methods
    that refuse the model are left out."""
    curves = {}
    for name, fn in resolve_methods(methods, r.hooked):
        try:
            result = fn(r.hooked.model, r.images, targets)
        except ValueError:
            continue
        maps = result.maps if isinstance(result, SaliencyResult) else result
        keep = (~constant_maps(maps)).nonzero()[:, 0].to(r.images.device)
        if len(keep) < len(maps):
            name = f"{name} ({len(keep)} of {len(maps)} images)"
        if len(keep):
            kept = (r.images[keep], maps[keep.to(maps.device)], targets[keep.to(targets.device)])
            curves[name] = [road(r.hooked, *kept, order=o) for o in ORDERS]
    return curves


def _predictions(r: ReportInputs) -> Tensor:
    """(B,) the model's classes for the report's images."""
    with torch.no_grad():
        return model_logits(r.hooked(r.images)).argmax(-1)


def _report_methods(has_attention: bool) -> list:
    """The default methods as the report runs them: by name, but integrated gradients (of
    `IG_STEPS` steps) and AttnLRP as (name, fn) pairs that explain `BACKWARD_IMAGES` images
    per call (`_in_slices`)."""
    quick = {
        "integrated_gradients": _in_slices(
            lambda hm, x, targets: integrated_gradients(hm, x, targets, n_steps=IG_STEPS)
        ),
        "attnlrp": _in_slices(registered("attnlrp")),
    }
    return [(n, quick[n]) if n in quick else n for n in default_methods(has_attention)]


def _in_slices(method: Callable) -> Callable:
    """``method(hm, x, targets)`` run on `BACKWARD_IMAGES` images x (B, C, H, W) at a time (an
    image's map is its own): a backward pass holds every image's activations, and so does
    each pass of interpolated copies, as many as the images explained at once."""

    def sliced(hm: HookedModel, x: Tensor, targets) -> SaliencyResult:
        parts = []
        for rows in torch.arange(len(x), device=x.device).split(BACKWARD_IMAGES):
            if is_score_target(targets):
                chosen = select_images(targets, rows)
            else:
                chosen = targets[rows.to(targets.device)]
            parts.append(method(hm, x[rows], chosen))
        return _joined(parts)

    return sliced


def _joined(parts: list[SaliencyResult]) -> SaliencyResult:
    """The results of consecutive chunks of a batch as one: maps, targets and extras
    concatenated (the first chunk's options and layout)."""
    first = parts[0]
    targets = None if first.targets is None else torch.cat([p.targets for p in parts])
    extras = {key: torch.cat([p.extras[key] for p in parts]) for key in first.extras}
    maps = torch.cat([p.maps for p in parts])
    return dataclasses.replace(first, maps=maps, targets=targets, extras=extras)


def representations(r: ReportInputs) -> Section:
    data = r.cka_images if r.cka_images is not None else r.images
    if len(data) < 8:
        raise NotApplicable(f"CKA needs at least 8 images; the data has {len(data)}.")
    try:
        evolution = analysis.feature_evolution(
            r.hooked, data, batch_size=min(32, len(data)), progress=False
        )
    except ValueError as error:
        raise NotApplicable(str(error)) from error
    return Section(
        "Representation similarity (CKA)",
        f"Minibatch linear CKA (unbiased HSIC) between every pair of block outputs over "
        f"{evolution.cka.options['examples']} images, and the Refiner paper's feature-evolution "
        "curve (Eq. 2).",
        [viz.cka_heatmap(evolution.cka), viz.feature_evolution_curves({r.name: evolution})],
    )


def residual_ratios(r: ReportInputs) -> Section:
    try:
        result = analysis.residual_ratios(r.hooked, r.images)
    except ValueError as error:
        raise NotApplicable(str(error)) from error
    figures = [viz.residual_ratio_curves(result)]
    layerscale = any(result.has_layerscale)
    if layerscale:
        figures.append(viz.residual_ratio_curves(result, scaled=False))
        figures.append(viz.layerscale_heatmap(analysis.layerscale(r.hooked)))
    which = "with and without LayerScale's λ" if layerscale else "(the model has no LayerScale)"
    return Section(
        "Residual-norm ratios",
        "How much each residual branch adds to the stream entering it, ‖branch‖ / ‖x‖ per "
        f"image (CaiT Fig. 4), {which}.",
        figures,
    )


def sae_features(r: ReportInputs) -> Section:
    """A sparse autoencoder of the model (``--sae``): its scores on its store and spliced into
    the model on the report's images, and the latents most active on those images."""
    if r.sae is None:
        raise NotApplicable(
            "no sparse autoencoder was given (vizkit report --sae FOLDER, the folder "
            "vk.train_sae(..., checkpoint=FOLDER) wrote)"
        )
    from .. import sae as saes

    model = saes.SparseAutoencoder.load(r.sae).to(next(r.model.parameters()).device)
    data = (r.images, r.labels) if r.labels is not None else (r.images,)
    spliced = saes.spliced_score(r.hooked, model, data, progress=False)  # refuses another model
    rows = {"autoencoder": f"{model.kind}, {model.latents} latents"
            + (f", k={model.k}" if model.k else "") + f" on {model.source['layer']}"}  # fmt: skip
    try:
        scores = saes.evaluate_sae(model, progress=False)
    except FileNotFoundError:
        rows["on its store"] = f"not scored: the store {model.source['store']} is gone"
    else:
        rows["on its store"] = (f"FVU {scores.fvu:.3f}, L0 {scores.l0:.1f}, dead "
                                f"{scores.dead:.1%}, dense {scores.dense:.1%}")  # fmt: skip
    rows["spliced in"] = _spliced_text(spliced)
    maps = saes.latent_maps(r.hooked, model, r.images)  # (B, latents, gh, gw)
    chosen = maps.amax((2, 3)).mean(0).argsort(descending=True)[:4].tolist()  # peaks
    try:
        effects = saes.logit_effects(r.hooked, model, r.images)
    except ValueError:
        notes = None
    else:
        names = r.classes or [f"class {c}" for c in range(effects.effects.shape[0])]
        notes = [f"raises {names[effects.top_classes(i, 1)[0][0]]}" for i in chosen]
    figure = viz.latent_maps_figure(maps[:, chosen], viz.display_images(r.images, r.model),
                                    chosen, model.source["layer"], notes)  # fmt: skip
    return Section(
        "Features (sparse autoencoder)",
        "The sparse autoencoder given with --sae: its fraction of variance unexplained, L0 and "
        "dead and dense latents on its store, and its reconstruction spliced into the model in "
        "place of the activation on these images (KL divergence to the clean predictions, "
        "against every latent off). The figure shows the four latents of the highest peaks on "
        "these images (each latent's largest patch, averaged over the images) and, where the "
        "layer is a block's output, the class each raises most directly. "
        "vk.widgets.FeatureBrowser browses every latent over its store.",
        [figure],
        _table(rows),
    )


def _spliced_text(score) -> str:
    if score.kl is None:
        return f"embedding cosine to the clean run {score.embedding_cosine:.3f}"
    text = f"KL {score.kl:.3g} (every latent off: {score.kl_bias_only:.3g})"
    if score.accuracy_clean is not None:
        text += f", accuracy {score.accuracy_clean:.0%} -> {score.accuracy_spliced:.0%}"
    return text + f", top-1 unchanged on {score.agreement:.0%}"


def history(r: ReportInputs) -> Section:
    records = r.card.get("history")
    if not records:
        raise NotApplicable("the model does not come from the zoo, so there is no history.")
    figures = [viz.training_curves(records, f"Training history of {r.name}")]
    if any("residual_ratios" in h for h in records):
        figures.append(viz.residual_ratio_curves(tracked_results(records, "residual_ratios")))
    return Section("Training", "Loss and accuracy per epoch from the model card.", figures)


def _require_classes(r: ReportInputs, why: str) -> None:
    """Raise NotApplicable for a backbone (embeddings, no class logits), saying ``why``."""
    if is_backbone(r.model):
        raise NotApplicable(
            f"{type(r.model).__name__} is a backbone: it returns embeddings, not classes, so {why}."
        )


def _has_self_attention(r: ReportInputs) -> bool:
    return bool(analysis.self_attention_names(r.hooked))


def _require_self_attention(r: ReportInputs) -> None:
    """Raise NotApplicable for models without attention patterns (no forward pass)."""
    if not _has_self_attention(r):
        raise NotApplicable(f"{type(r.model).__name__} has no self-attention patterns.")


def _attention(r: ReportInputs) -> analysis.AttentionResult | analysis.Stages:
    """Every self-attention layer's maps (`Stages` for a hierarchical model); its last stage's
    where every stage would not fit in memory (an early stage's window maps in image space are
    Np x Np per head)."""
    try:
        return analysis.attention(r.hooked, r.images)
    except ValueError:
        pass
    try:
        layers = analysis.stage_layers(r.hooked, tuple(r.images.shape[-2:]))
        return analysis.attention(r.hooked, r.images, layers=layers)
    except ValueError as error:
        raise NotApplicable(str(error)) from error


def _overlays(r: ReportInputs, title: str, text: str, result) -> Section:
    images = viz.display_images(r.images, r.model)
    return Section(title, text, [viz.saliency_row(result, images, count=4, classes=r.classes)])


def _quiet(fn: Callable):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # methods that do not apply are noted in the table
        return fn()


def _breakable(markup: str) -> str:
    """``markup`` with a line-break opportunity after each underscore of its text, so that
    long names (``integrated_gradients``, ``energy_in_mask``) wrap in narrow windows."""
    return re.sub(r">([^<]+)<", lambda m: ">" + m[1].replace("_", "_<wbr>") + "<", markup)


def _table(rows: dict[str, str]) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows.items()
    )
    return f"<table class='summary'>{cells}</table>"


SECTIONS: dict[str, Callable[[ReportInputs], Section]] = {
    "summary": summary,
    "predictions": predictions,
    "attention": attention,
    "rollout": rollout,
    "class_attention": class_attention,
    "saliency": saliency,
    "evaluation": evaluation,
    "representations": representations,
    "residual_ratios": residual_ratios,
    "features": sae_features,
    "history": history,
}


def add_section(
    name: str, build: Callable[[ReportInputs], Section], before: str = "history"
) -> None:
    """Add a report section (a paper package's own) to `SECTIONS`, placed before ``before``."""
    if name in SECTIONS:
        raise ValueError(f"A report section {name!r} exists already.")
    items = list(SECTIONS.items())
    at = [key for key, _ in items].index(before)
    SECTIONS.clear()
    SECTIONS.update(items[:at] + [(name, build)] + items[at:])
