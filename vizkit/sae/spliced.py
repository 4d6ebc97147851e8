"""The spliced-in score: the model run with an autoencoder's reconstruction in place of the
activation it was trained on (through `HookedModel.hooks`), compared with the clean run: the
KL divergence of the predictions, the accuracies, and the same KL with every latent off (the
decoder bias alone) as the scale the first is read against."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..datasets.labelled import labelled_batches
from ..hooks import HookedModel
from ..hooks.contract import analysis_contract, eval_mode
from ..hooks.inputs import check_count, check_images
from ..hooks.scores import is_backbone, model_logits, refuse_dense
from ..store.manifest import model_identity, preprocessing_of
from ..store.tokens import token_positions
from ..targets import embedding_of
from .autoencoder import SparseAutoencoder
from .evaluation import check_source

__all__ = ["SplicedScore", "replaced_tokens", "spliced_score", "splice_hook"]

LatentEdit = Callable[[Tensor], Tensor]  # (B, T, latents) -> (B, T, latents)


@dataclass(frozen=True)
class SplicedScore:
    """Clean against spliced-in predictions over ``images`` images.

    Attributes:
        kl: mean KL(clean || spliced) of the class probabilities (nats); None on a backbone.
        kl_bias_only: the same with every latent off (the reconstruction is the decoder bias).
        kl_recovered: ``1 - kl / kl_bias_only``.
        accuracy_clean, accuracy_spliced: top-1 accuracy (None without labels or logits).
        agreement: fraction of images whose top-1 class is unchanged.
        embedding_cosine: on a backbone, mean cosine of clean and spliced embeddings.
    """

    images: int
    kl: float | None
    kl_bias_only: float | None
    kl_recovered: float | None
    accuracy_clean: float | None
    accuracy_spliced: float | None
    agreement: float | None
    embedding_cosine: float | None

    def __repr__(self) -> str:
        shown = {k: v for k, v in vars(self).items() if v is not None}
        return "SplicedScore(" + ", ".join(f"{k}={_short(v)}" for k, v in shown.items()) + ")"


def _short(value: float | int) -> str:
    return str(value) if isinstance(value, int) else f"{value:.4g}"


@analysis_contract(videos=True)
def spliced_score(
    model: nn.Module | HookedModel,
    sae: SparseAutoencoder,
    data: object = "shapes",
    batch_size: int = 32,
    progress: bool = True,
) -> SplicedScore:
    """Run ``model`` over ``data`` clean, with ``sae``'s reconstruction spliced in at the
    tokens it was trained on, and with every latent off; compare the outputs.

    ``data``: (images, labels) as `vk.evaluate` takes them (a Dataset, a DataLoader, a tuple,
    or "shapes"). Refuses a model other than the one the autoencoder's store was made with.
    """
    refuse_dense(model.model, "spliced_score (the KL of the class probabilities)")
    batches, count = labelled_batches(data, check_count("batch_size", batch_size), "spliced_score")
    backbone = is_backbone(model.model)
    sums = {"kl": 0.0, "kl_bias_only": 0.0, "clean": 0.0, "spliced": 0.0, "agree": 0.0,
            "cosine": 0.0}  # fmt: skip
    images, labelled = 0, True
    device = next(model.model.parameters()).device
    layer, positions = sae.source.get("layer"), {}
    for x, labels, _ in tqdm(batches, total=None if count is None else -(-count // batch_size),
                             disable=not progress, unit="batch", desc="spliced_score"):  # fmt: skip
        x = check_images(model.model, x.to(device))
        size = tuple(x.shape[-2:])
        if size not in positions:
            positions[size] = replaced_tokens(model, sae, size)
        hook = splice_hook(sae, positions[size])
        off = _bias_only_hook(sae, positions[size])
        with torch.no_grad(), eval_mode(sae):
            clean = model.model(x)
            with model.hooks(fwd={layer: hook}):
                spliced = model.model(x)
            with model.hooks(fwd={layer: off}):
                ablated = model.model(x)
        images += len(x)
        if backbone:
            pair = embedding_of(clean).float(), embedding_of(spliced).float()
            sums["cosine"] += float(F.cosine_similarity(*pair, dim=-1).sum())
            continue
        clean, spliced, ablated = (model_logits(o).float() for o in (clean, spliced, ablated))
        sums["kl"] += float(_kl(clean, spliced).sum())
        sums["kl_bias_only"] += float(_kl(clean, ablated).sum())
        sums["agree"] += float((clean.argmax(-1) == spliced.argmax(-1)).sum())
        if labels is None:
            labelled = False
        else:
            labels = labels.to(device)
            sums["clean"] += float((clean.argmax(-1) == labels).sum())
            sums["spliced"] += float((spliced.argmax(-1) == labels).sum())
    if images == 0:
        raise ValueError("data is empty: there is nothing to score.")
    mean = {key: value / images for key, value in sums.items()}
    if backbone:
        return SplicedScore(images, None, None, None, None, None, None, mean["cosine"])
    recovered = 1 - mean["kl"] / mean["kl_bias_only"] if mean["kl_bias_only"] > 0 else None
    return SplicedScore(
        images, mean["kl"], mean["kl_bias_only"], recovered,
        mean["clean"] if labelled else None, mean["spliced"] if labelled else None,
        mean["agree"], None,
    )  # fmt: skip


def replaced_tokens(hm: HookedModel, sae: SparseAutoencoder, image_size: tuple[int, int]) -> Tensor:
    """(T,) the token positions of ``sae``'s layer it reads on images of ``image_size``: those
    its store kept (k random patches: every patch). Refuses another model than its store's."""
    layer = sae.source.get("layer")
    check_source(
        sae,
        {"model": model_identity(hm.model), "image_size": list(image_size),
         "preprocessing": preprocessing_of(hm.model)},
        f"{type(hm.model).__name__} on {image_size[0]}x{image_size[1]} images",
    )  # fmt: skip
    tokens = sae.source["tokens"]
    tokens = "patches" if isinstance(tokens, int) else tokens
    layout = hm.token_layout(image_size, layer)
    return token_positions(tokens, layout, torch.zeros(1), 0, layer)[0]


def splice_hook(
    sae: SparseAutoencoder, positions: Tensor, edit: LatentEdit | None = None,
    keep_error: bool = False,
) -> Callable[..., Tensor]:  # fmt: skip
    """A forward hook for `HookedModel.hooks`: the tokens ``positions`` of the activation
    (B, N, C) replaced by ``sae``'s reconstruction of its latents changed by ``edit``; with
    ``keep_error``, the activation plus what the edit changes in the reconstruction
    (``x + decode(edit(z)) - decode(z)``: the autoencoder's error stays in place, so an edit
    that changes nothing leaves the activation as it was)."""

    def hook(value: Tensor, *, name: str) -> Tensor:
        tokens = value[:, positions]
        latents = sae.encode(tokens.to(sae.W_dec.device))
        edited = latents if edit is None else edit(latents)
        if keep_error:
            new = tokens.float() + ((edited - latents) @ sae.W_dec / sae.input_scale).to(
                value.device
            )
        else:
            new = sae.decode(edited)
        replaced = value.clone()
        replaced[:, positions] = new.to(value.device, value.dtype)
        return replaced

    return hook


def _bias_only_hook(sae: SparseAutoencoder, positions: Tensor) -> Callable[..., Tensor]:
    """`splice_hook` with every latent off: the tokens ``positions`` replaced by the
    reconstruction of no latent (the decoder bias), which reads nothing, so encodes nothing."""
    with torch.no_grad():
        bias = sae.decode(torch.zeros(sae.latents, device=sae.W_dec.device))  # (C,)

    def hook(value: Tensor, *, name: str) -> Tensor:
        replaced = value.clone()
        replaced[:, positions] = bias.to(value.device, value.dtype)
        return replaced

    return hook


def _kl(clean: Tensor, other: Tensor) -> Tensor:
    """(B,) KL(softmax(clean) || softmax(other)) (rounding below 0 read as 0)."""
    log_p, log_q = clean.double().log_softmax(-1), other.double().log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0)
