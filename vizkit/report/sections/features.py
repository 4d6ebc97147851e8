"""The features section: a sparse autoencoder of the model (``--sae``), scored on its store and
spliced into the model on the report's images, and the latents most active on those images."""

from __future__ import annotations

from ... import viz
from ..inputs import ReportInputs
from .base import NotApplicable, Section, html_table

__all__ = ["sae_features"]


def sae_features(r: ReportInputs) -> Section:
    """A sparse autoencoder of the model (``--sae``): its scores on its store and spliced into
    the model on the report's images, and the latents most active on those images."""
    if r.sae is None:
        raise NotApplicable(
            "no sparse autoencoder was given (vizkit report --sae FOLDER, the folder "
            "vk.train_sae(..., checkpoint=FOLDER) wrote)"
        )
    from ... import sae as saes

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
        html_table(rows),
    )


def _spliced_text(score) -> str:
    """One line of a `spliced_score`: KL (or, for a backbone, the embedding cosine) to the
    clean run, accuracy and top-1 agreement."""
    if score.kl is None:
        return f"embedding cosine to the clean run {score.embedding_cosine:.3f}"
    text = f"KL {score.kl:.3g} (every latent off: {score.kl_bias_only:.3g})"
    if score.accuracy_clean is not None:
        text += f", accuracy {score.accuracy_clean:.0%} -> {score.accuracy_spliced:.0%}"
    return text + f", top-1 unchanged on {score.agreement:.0%}"
