"""How good a sparse autoencoder is, on the store's rows: the fraction of variance unexplained,
L0, dead and dense latents (`evaluate_sae`, one sequential pass over the rows, each batch's
code kept as its non-zero entries: `vizkit.sae.sparse_latents`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..hooks.contract import eval_mode
from ..hooks.inputs import check_count, check_number
from ..store import ActivationStore
from ..store.manifest import differences
from .autoencoder import SparseAutoencoder
from .rows import TensorRows
from .sparse_latents import sparse_latents

__all__ = ["SAEScores", "check_source", "evaluate_sae"]

DENSE_ABOVE = 0.1  # a latent firing on more than a tenth of the tokens is dense
LATENT_BYTES = 256 * 2**20  # the latents of one batch of rows


@dataclass(frozen=True)
class SAEScores:
    """An autoencoder's scores over ``rows`` rows of a store.

    Attributes:
        fvu: ``sum ||x - x_hat||^2 / sum ||x - mean x||^2`` over all rows.
        l0: mean number of non-zero latents per row.
        dead: fraction of latents that fire on no row; dense: on more than ``dense_above``.
        density: (latents,) each latent's fraction of rows it fires on.
    """

    fvu: float
    l0: float
    dead: float
    dense: float
    density: Tensor
    rows: int
    dense_above: float

    def __repr__(self) -> str:
        return (
            f"SAEScores(fvu={self.fvu:.4f}, L0={self.l0:.1f}, dead={self.dead:.1%}, "
            f"dense={self.dense:.1%} (>{self.dense_above:.0%} of rows), rows={self.rows})"
        )


def evaluate_sae(
    sae: SparseAutoencoder,
    store: ActivationStore | str | Tensor | None = None,
    batch_size: int = 4096,
    dense_above: float = DENSE_ABOVE,
    progress: bool = True,
) -> SAEScores:
    """Score ``sae`` on every row of ``store`` (default: the store it was trained on; another
    store must hold the same layer of the same model, e.g. held-out images), or of rows
    (n, width) in memory; ``batch_size`` rows at a time, fewer where their latents would
    exceed `LATENT_BYTES`."""
    dense_above = check_number("dense_above", dense_above, 0, 1, high_open=True)
    if store is None and not sae.source:
        raise ValueError("This autoencoder was trained on rows given as a tensor: pass them.")
    if isinstance(store, Tensor):
        rows = TensorRows(store)
    else:
        store = ActivationStore(sae.source["store"]) if store is None else store
        rows = store if isinstance(store, ActivationStore) else ActivationStore(store)
        rows = rows if rows.name == sae.source.get("layer") else _named_layer(rows, sae)
        check_source(sae, rows.manifest["settings"], f"the store {rows.folder}")
    store = rows
    # rows per batch: at most batch_size, and latents (float32) of at most LATENT_BYTES
    batch_size = max(
        1, min(check_count("batch_size", batch_size), LATENT_BYTES // (4 * sae.latents))
    )
    device = sae.W_dec.device
    fired = torch.zeros(sae.latents, dtype=torch.float64, device=device)
    error = total = squares = active = 0.0
    sums = torch.zeros(sae.width, dtype=torch.float64, device=device)
    with torch.no_grad(), eval_mode(sae):
        for rows in tqdm(store.batches(batch_size), total=-(-len(store) // batch_size),
                         disable=not progress, unit="batch", desc="evaluate_sae"):  # fmt: skip
            x = rows.to(device).float()
            code = sparse_latents(sae, x)
            error += float((code.decode(sae) - x).double().square().sum())
            squares += float(x.double().square().sum())
            sums += x.double().sum(0)
            fired += code.fired(sae.latents)
            active += len(code.value)
            total += len(x)
    spread = squares - float(sums.square().sum()) / total  # sum ||x - mean||^2
    density = (fired / total).float().cpu()
    return SAEScores(
        fvu=error / spread, l0=active / total, dead=float((density == 0).float().mean()),
        dense=float((density > dense_above).float().mean()), density=density, rows=int(total),
        dense_above=dense_above,
    )  # fmt: skip


def check_source(sae: SparseAutoencoder, settings: dict, what: str) -> None:
    """Refuse ``settings`` (a store's, or a model's) that do not match the ones ``sae`` was
    trained on: the model's class and weights, the image size and the preprocessing."""
    if not sae.source.get("model"):
        raise ValueError(
            f"This autoencoder was trained on rows given as a tensor, so nothing says which "
            f"model and activation they came from; it cannot be checked against {what}. Train "
            "it on a store instead: vk.train_sae(vk.cache_activations(model, data, out))."
        )
    keys = ("model", "image_size", "preprocessing")
    changed = differences({k: sae.source.get(k) for k in keys}, {k: settings.get(k) for k in keys})
    if changed:
        raise ValueError(
            f"This autoencoder was trained on {sae.source.get('layer')} of another model or "
            f"input than {what} ({'; '.join(changed)}; trained on -> given). Use it with the "
            "model and settings it was trained on, or train one on a store of this model "
            "(vk.cache_activations, then vk.train_sae)."
        )


def _named_layer(store: ActivationStore, sae: SparseAutoencoder) -> ActivationStore:
    layer = sae.source.get("layer")
    if layer not in store.manifest["layers"]:
        raise ValueError(
            f"This autoencoder reads {layer}; the store {store.folder} holds "
            f"{list(store.manifest['layers'])}. Pass a store of that layer."
        )
    return store.layer(layer)
