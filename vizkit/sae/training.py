"""`train_sae`: fit a sparse autoencoder to one layer of an activation store.

The recipe of Gao et al. 2024, "Scaling and evaluating sparse autoencoders": inputs scaled to a
mean norm of ``sqrt(width)``, the decoder bias started at the rows' geometric median, unit-norm
decoder rows (the gradient's component along each row removed before the step, the rows
renormalized after it), Adam with a linear warm-up and a linear decay to zero over the last
part of the run, and the AuxK loss on latents that have not fired for ``dead_after`` tokens.
Checkpoints hold everything a resumed run needs, so a killed run continues bit for bit.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..hooks.inputs import check_count
from ..runs import replaced_whole
from ..store import ActivationStore
from .autoencoder import BATCH_KINDS, KINDS, SparseAutoencoder, matryoshka_prefixes
from .losses import auxk_loss, l1_penalty, matryoshka_loss, normalized_mse
from .order import ShuffledBatches
from .rows import Rows, as_rows, check_finite, rows_source
from .settings import B_DEC_STARTS, TrainingSettings
from .sparse_step import sparse_code

__all__ = ["train_sae"]

INIT_ROWS = 16_384  # rows the input scale and the decoder bias are estimated from
DEAD_AFTER = 10_000_000  # Gao et al. Sec. A.2: dead after 10 M tokens without firing
BLOCK_BYTES = 256 * 2**20
DEFAULT_STEPS = 1000  # the fewest steps the default ``tokens`` trains for


def train_sae(
    store: ActivationStore | str | Path | Tensor,
    layer: str | int | None = None,
    kind: str = "topk",
    expansion: int = 8,
    k: int | None = 32,
    *,
    l1: float = 0.03,
    prefixes: list[int] | None = None,
    tokens: int | None = None,
    batch_size: int = 4096,
    lr: float | None = None,
    warmup: float = 0.05,
    decay: float = 0.2,
    aux_k: int | None = None,
    aux_coefficient: float = 1 / 32,
    dead_after: int | None = None,
    b_dec: str = "median",
    checkpoint: str | Path | None = None,
    checkpoint_every: int | None = None,
    block_bytes: int = BLOCK_BYTES,
    device: torch.device | str | None = None,
    seed: int = 0,
    progress: bool = True,
) -> SparseAutoencoder:
    """Train a sparse autoencoder on the rows of ``layer`` of ``store``.

    Args:
        store: an `ActivationStore` or its folder (`vk.cache_activations`), or rows
            (n, width) already in memory (an autoencoder of those has no model to splice into).
        layer: the stored layer: its hook name, or an int counting the stored layers
            (negative from the end, as ``layers=`` elsewhere); default the store's first.
        kind: "topk", "batchtopk", "relu" or "matryoshka" (`SparseAutoencoder`).
        expansion: latents per channel (latents = expansion x width).
        k: latents kept per token (topk; batchtopk: on average); ignored for "relu".
        l1: the L1 coefficient of "relu" (on inputs of mean norm sqrt(width)).
        prefixes: the nested dictionary sizes of "matryoshka" (default latents / 16, / 4 and
            all).
        tokens: rows to train on (default: the store once, or 1,000 steps' worth where the
            store holds fewer: a 64-image store and the default batch took one step);
            steps = tokens // batch_size.
        batch_size: rows per step.
        lr: Adam's learning rate (default Gao et al.'s ``2e-4 / sqrt(latents / 2**14)``).
        warmup, decay: the fractions of the steps the learning rate rises over (from 0) and
            falls over (to 0, at the end).
        aux_k, aux_coefficient: AuxK's latents (default width // 2) and weight (1/32); 0
            turns it off; not used for "relu".
        dead_after: rows without firing after which a latent counts as dead (default 10 M,
            or a tenth of ``tokens`` if that is less).
        b_dec: where the decoder bias starts: "median" (geometric), "mean" or "zeros".
        checkpoint: a folder: the state is saved there every ``checkpoint_every`` steps
            (default a tenth of the run, at most 1000) and at the end (with ``sae.json``);
            a folder holding a run of the same settings is resumed, of other settings refused.
        block_bytes: the bytes of consecutive rows read and shuffled at a time (`ShuffledBatches`).
        device: where to train (default CUDA when available).
        progress: a progress bar with the batch's FVU, L0 and dead fraction.

    Returns:
        The trained `SparseAutoencoder` (eval mode, on ``device``), its ``source`` naming the
        store, layer, tokens and model.
    """
    store = as_rows(store, layer)
    batch_size = check_count("batch_size", batch_size)
    # the store once, or DEFAULT_STEPS steps where that is fewer (a small store: epochs)
    tokens = max(len(store), DEFAULT_STEPS * batch_size) if tokens is None else tokens
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}.")
    width = store.width
    latents = check_count("expansion", expansion) * width
    k = None if kind == "relu" else k
    prefixes = matryoshka_prefixes(kind, prefixes, latents)
    settings = TrainingSettings(
        kind=kind,
        latents=latents,
        k=k,
        l1=l1 if kind == "relu" else None,
        prefixes=None if prefixes is None else tuple(prefixes),
        tokens=tokens,
        batch_size=batch_size,
        lr=lr if lr is not None else 2e-4 / math.sqrt(latents / 2**14),
        warmup=warmup,
        decay=decay,
        aux_k=(width // 2 if aux_k is None else aux_k) if kind != "relu" else 0,
        aux_coefficient=aux_coefficient,
        dead_after=dead_after if dead_after is not None else min(DEAD_AFTER, tokens // 10),
        b_dec=b_dec,
        block_bytes=block_bytes,
        seed=seed,
        source=rows_source(store),
    )  # fmt: skip  (every option checked here, before a row is read)
    every = (
        max(1, min(1000, settings.steps // 10))
        if checkpoint_every is None
        else check_count("checkpoint_every", checkpoint_every)
    )
    folder = _checkpoint_folder(checkpoint)
    batches = ShuffledBatches(store, batch_size, seed, block_bytes)
    check_finite(store, batches.block_rows)  # after the arguments: a store is read whole
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    sae = SparseAutoencoder(width, latents, kind, k, source=settings.source, seed=seed,
                            prefixes=prefixes)  # fmt: skip
    run = _Run(sae.to(device), settings)
    if folder is None or not run.resume(folder):
        run.initialize(store)
    steps = settings.steps
    bar = tqdm(total=steps, initial=run.step, disable=not progress, unit="step",
               desc=f"train_sae {kind}")  # fmt: skip
    stream = batches.from_step(run.step)
    while run.step < steps:  # a finished run (resumed) reads nothing
        metrics = run.train_step(next(stream).to(device, non_blocking=True))
        bar.update()
        if progress and (run.step % 10 == 0 or run.step == steps):
            bar.set_postfix({key: f"{float(value):.3g}" for key, value in metrics.items()})
        if folder is not None and (run.step % every == 0 or run.step == steps):
            run.save(folder)
    bar.close()
    if folder is not None:
        sae.save(folder)
    return sae.eval()


class _Run:
    """One training run's state: the autoencoder, Adam, the step, and the row count at which
    each latent last fired."""

    def __init__(self, sae: SparseAutoencoder, settings: TrainingSettings) -> None:
        self.sae, self.settings = sae, settings
        self.optimizer = torch.optim.Adam(sae.parameters(), lr=settings.lr,
                                          betas=(0.9, 0.999), eps=6.25e-10)  # fmt: skip
        self.step, self.rows_seen = 0, 0
        self.last_fired = torch.zeros(sae.latents, dtype=torch.long, device=sae.W_dec.device)

    def initialize(self, store: Rows) -> None:
        """Input scale and decoder bias from up to INIT_ROWS rows spread over the store."""
        sample = _spread_rows(store, INIT_ROWS).to(self.sae.W_dec.device).float()
        scale = math.sqrt(store.width) / float(sample.norm(dim=1).mean().clamp_min(1e-12))
        scaled = sample * scale
        with torch.no_grad():
            self.sae.input_scale.fill_(scale)
            self.sae.b_dec.copy_(B_DEC_STARTS[self.settings.b_dec](scaled))

    def train_step(self, batch: Tensor) -> dict[str, Tensor]:
        """One Adam step on ``batch`` (B, width); the batch's FVU, L0 and dead fraction."""
        sae, settings = self.sae.train(), self.settings
        dead = self.rows_seen - self.last_fired >= settings.dead_after
        if sae.kind == "topk":
            loss, fvu, fired, l0 = self._sparse_losses(batch, dead)
            z = None
        else:
            loss, fvu, z = self._dense_losses(batch, dead)
            fired, l0 = (z > 0).any(0), (z > 0).sum(-1).float().mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        _remove_parallel_gradient(sae.W_dec)
        for group in self.optimizer.param_groups:
            group["lr"] = settings.lr * settings.learning_rate_factor(self.step)
        self.optimizer.step()
        with torch.no_grad():
            sae.W_dec /= sae.W_dec.norm(dim=1, keepdim=True)
            self.rows_seen += len(batch)
            self.last_fired[fired] = self.rows_seen
            if sae.kind in BATCH_KINDS:
                _update_threshold(sae, z)
        self.step += 1
        return {"fvu": fvu.detach(), "L0": l0, "dead": dead.float().mean()}

    def _aux_on(self) -> bool:
        return self.settings.aux_k > 0 and self.settings.aux_coefficient > 0

    def _dense_losses(self, batch: Tensor, dead: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(loss, FVU, the latents z (B, latents)) of the batch, every latent computed."""
        sae, settings = self.sae, self.settings
        pre = sae.pre_activations(batch)
        x = batch.float() * sae.input_scale  # the rows in the autoencoder's scale
        z = sae.activate(pre)
        reconstruction = z @ sae.W_dec + sae.b_dec
        fvu = normalized_mse(reconstruction, x)
        loss = fvu
        if sae.kind == "matryoshka":
            loss = matryoshka_loss(z, sae.W_dec, sae.b_dec, x, sae.prefixes)
        if sae.kind == "relu":
            loss = loss + settings.l1 * l1_penalty(z, sae.W_dec)
        elif self._aux_on():
            residual = (x - reconstruction).detach()
            aux = auxk_loss(pre, dead, residual, sae.W_dec, settings.aux_k)
            loss = loss + settings.aux_coefficient * aux
        return loss, fvu, z

    def _sparse_losses(self, batch: Tensor, dead: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(loss, FVU, the latents fired (latents,), L0) of a TopK autoencoder's batch from
        its k latents per row (`vizkit.sae.sparse_step`): the dense losses' values."""
        sae, settings = self.sae, self.settings
        x = batch.float() * sae.input_scale
        code = sparse_code(sae, x, dead, settings.aux_k if self._aux_on() else 0)
        reconstruction = code.decode(sae.W_dec) + sae.b_dec
        fvu = normalized_mse(reconstruction, x)
        loss = fvu
        if code.aux_indices.shape[1]:
            residual = (x - reconstruction).detach()
            aux = normalized_mse(code.decode(sae.W_dec, aux=True), residual)
            loss = loss + settings.aux_coefficient * aux
        l0 = (code.values > 0).sum(-1).float().mean()
        return loss, fvu, code.fired(sae.latents), l0

    def save(self, folder: Path) -> None:
        """The run's whole state to ``folder/checkpoint.pt``, whole or not at all."""
        folder.mkdir(parents=True, exist_ok=True)
        state = {"settings": self.settings.to_json(), "step": self.step,
                 "rows_seen": self.rows_seen, "last_fired": self.last_fired,
                 "sae": self.sae.state_dict(),
                 "optimizer": self.optimizer.state_dict()}  # fmt: skip
        with replaced_whole(folder / "checkpoint.pt") as partial:
            torch.save(state, partial)

    def resume(self, folder: Path) -> bool:
        """Load the checkpoint in ``folder`` if there is one (refused if its settings
        differ); whether one was loaded."""
        file = folder / "checkpoint.pt"
        if not file.is_file():
            return False
        try:
            state = torch.load(file, map_location=self.sae.W_dec.device, weights_only=True)
            saved = TrainingSettings.from_json(state["settings"], str(file))
        except (RuntimeError, EOFError, KeyError, TypeError, pickle.UnpicklingError) as error:
            raise ValueError(
                f"{file} is damaged or not a train_sae checkpoint ({str(error)[:200]}). Delete "
                f"the folder {str(folder)!r} to train from the start, or pass another "
                "checkpoint folder."
            ) from None
        changed = saved.differences(self.settings)
        if changed:
            raise ValueError(
                f"The checkpoint in {folder} is of another run ({'; '.join(changed)}; saved -> "
                "given). Pass the same settings to resume it, or another checkpoint folder."
            )
        self.sae.load_state_dict(state["sae"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.rows_seen = state["step"], state["rows_seen"]
        self.last_fired.copy_(state["last_fired"])
        return True


def _checkpoint_folder(checkpoint: str | Path | None) -> Path | None:
    """``checkpoint`` as a folder train_sae may write: new, empty, or holding its own
    checkpoint (resumed); one holding anything else, such as an autoencoder ``sae.save()``
    wrote, is refused rather than overwritten."""
    if checkpoint is None:
        return None
    folder = Path(checkpoint)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"checkpoint={str(folder)!r} is a file; pass a folder to write to.")
    if not folder.is_dir() or (folder / "checkpoint.pt").is_file():
        return folder
    found = sorted(p.name for p in folder.iterdir() if not p.name.endswith(".partial"))
    if {"sae.safetensors", "sae.json"} & set(found):
        raise ValueError(
            f"{folder} holds an autoencoder saved with sae.save() ({', '.join(found)}) and no "
            "training checkpoint: train_sae would overwrite it. Load it with "
            f"vk.sae.SparseAutoencoder.load({str(folder)!r}), or pass another checkpoint folder."
        )
    if found:
        raise ValueError(
            f"{folder} is not a train_sae checkpoint folder (it holds {', '.join(found[:5])}); "
            "pass an empty or new folder."
        )
    return folder


def _spread_rows(store: Rows, count: int) -> Tensor:
    """Up to ``count`` rows (n, width) in 16 runs of consecutive rows spread over the store."""
    if len(store) <= count:
        return store.rows(0, len(store))
    run = count // 16
    starts = torch.linspace(0, len(store) - run, 16).long().tolist()
    return torch.cat([store.rows(s, s + run) for s in starts])


def _remove_parallel_gradient(W_dec: torch.nn.Parameter) -> None:
    """Drop each decoder row's gradient component along the row (the step then moves the row
    on its unit sphere, to first order; Bricken et al. 2023)."""
    if W_dec.grad is not None:
        along = (W_dec.grad * W_dec.data).sum(dim=1, keepdim=True)
        W_dec.grad -= along * W_dec.data


THRESHOLD_MOMENTUM = 0.99


def _update_threshold(sae: SparseAutoencoder, z: Tensor) -> None:
    """BatchTopK's inference threshold: a running mean of each batch's smallest kept latent
    (Bussmann et al. 2024, Eq. 5)."""
    kept = z[z > 0]
    if len(kept) == 0:
        return
    smallest = kept.min()
    if torch.isnan(sae.threshold):
        sae.threshold.copy_(smallest)
    else:
        sae.threshold.lerp_(smallest, 1 - THRESHOLD_MOMENTUM)
