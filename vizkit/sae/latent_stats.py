"""What each latent of a sparse autoencoder responds to, read from its store (no second pass
over the data): its density, its top-activating patches and images, its heat map over a
stored image, the latents firing at a chosen patch, how well it detects each class, and how
much of its activation falls on an object's mask."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from scipy.stats import rankdata
from torch import Tensor
from tqdm.auto import tqdm

from ..hooks.contract import eval_mode
from ..hooks.inputs import check_count
from ..store import ActivationStore
from .autoencoder import SparseAutoencoder
from .evaluation import check_source
from .sparse_latents import SparseLatents, sparse_latents

__all__ = ["ClassDetectors", "Features", "features"]

BATCH_BYTES = 256 * 2**20  # the latents of one batch of rows
IMAGE_BYTES = 256 * 2**20  # each image's largest activation of each latent, kept whole


@dataclass(repr=False)
class Features:
    """Each latent's statistics over the rows of ``store``.

    Attributes:
        density, mean_activation, max_activation: (latents,) the fraction of rows it fires
            on, its mean where it fires, its largest value.
        top_values, top_rows: (latents, top) its largest activations and their rows (0 and
            -1 past the rows it fires on).
        image_values, image_indices: (latents, top) its largest per-image maxima and images.
        image_max: (images, latents) each image's largest activation of each latent, or None
            where it exceeded the byte budget.
    """

    sae: SparseAutoencoder
    store: ActivationStore
    density: Tensor
    mean_activation: Tensor
    max_activation: Tensor
    top_values: Tensor
    top_rows: Tensor
    image_values: Tensor
    image_indices: Tensor
    image_max: Tensor | None

    def __repr__(self) -> str:
        alive = int((self.density > 0).sum())
        return (
            f"Features({len(self.density)} latents of {self.sae.source.get('layer')}, "
            f"{alive} alive, over {self.store.manifest['images']} images)"
        )

    def by_density(self, descending: bool = True) -> Tensor:
        """(alive,) the latents that fire, densest first (or rarest, ``descending=False``)."""
        alive = (self.density > 0).nonzero().flatten()
        order = self.density[alive].argsort(descending=descending, stable=True)
        return alive[order]

    def top_patches(self, latent: int, count: int | None = None) -> list[tuple[int, int, float]]:
        """(image, token position, activation) of the latent's largest activations."""
        found = []
        for value, row in zip(self.top_values[latent], self.top_rows[latent], strict=True):
            if value <= 0 or (count is not None and len(found) == count):
                break
            image, token = self.store.image_of(int(row))
            found.append((image, token, float(value)))
        return found

    def top_images(self, latent: int, count: int | None = None) -> list[tuple[int, float]]:
        """(image, its largest activation) of the images the latent fires most on."""
        pairs = zip(self.image_indices[latent].tolist(), self.image_values[latent].tolist(),
                    strict=True)  # fmt: skip
        found = [(image, value) for image, value in pairs if value > 0]
        return found[:count]

    def at_token(self, image: int, token: int, count: int = 10) -> list[tuple[int, float]]:
        """(latent, activation) of the latents firing most at token position ``token`` of
        stored image ``image`` (what a click on a patch asks)."""
        rows, positions = self.store.image_rows(image)
        where = (positions == token).nonzero().flatten()
        if len(where) == 0:
            raise ValueError(
                f"Token {token} of image {image} is not in the store (it keeps positions "
                f"{positions.tolist()[:12]}{'...' if len(positions) > 12 else ''})."
            )
        with torch.no_grad(), eval_mode(self.sae):
            z = self.sae.encode(rows[where].to(self.sae.W_dec.device))[0].cpu()
        top = z.topk(min(count, len(z)))
        return [(int(i), float(v)) for v, i in zip(top.values, top.indices, strict=True) if v > 0]

    def heatmap(self, latents: int | list[int], image: int) -> Tensor:
        """(gh, gw), or (L, gh, gw) for a list: the latents' activation on each patch of stored
        image ``image`` (a video's clip: (T', gh, gw), (L, T', gh, gw)); NaN on patches the
        store did not keep."""
        grid, prefix = self.store.grid, self.store.prefix_tokens
        if grid is None:
            raise ValueError(
                f"The store {self.store.folder} does not record its patch grid (written by an "
                "older vizkit); write it again with vk.cache_activations."
            )
        chosen = [latents] if isinstance(latents, int) else list(latents)
        rows, positions = self.store.image_rows(image)
        patches = positions >= prefix
        if not bool(patches.any()):
            raise ValueError(
                f"The store keeps no patch tokens (tokens="
                f"{self.store.manifest['settings']['tokens']!r}); a heat map needs patches: "
                "store tokens='patches' or 'all'."
            )
        with torch.no_grad(), eval_mode(self.sae):
            z = self.sae.encode(rows[patches].to(self.sae.W_dec.device))[:, chosen].cpu()
        cells = grid if self.store.frames is None else (self.store.frames, *grid)
        maps = torch.full((len(chosen), math.prod(cells)), float("nan"))
        maps[:, positions[patches] - prefix] = z.T
        maps = maps.view(len(chosen), *cells)
        return maps[0] if isinstance(latents, int) else maps

    def class_detectors(self, labels: Tensor) -> ClassDetectors:
        """How well each latent's per-image maximum separates each class from the rest: the
        ROC AUC (Mann-Whitney, ties averaged) for every (class, latent), over the stored
        images labelled ``labels`` (images,)."""
        if self.image_max is None:
            raise ValueError(
                "The per-image maxima were not kept (images x latents exceeded image_bytes); "
                "pass a larger image_bytes to vk.sae.features, or fewer images."
            )
        labels = torch.as_tensor(labels).long().cpu()
        if labels.shape != (len(self.image_max),):
            raise ValueError(
                f"labels must be ({len(self.image_max)},), one per stored image; got "
                f"{tuple(labels.shape)}."
            )
        ranks = torch.from_numpy(rankdata(self.image_max.numpy(), axis=0))  # (images, latents)
        classes = labels.unique()
        auc = torch.empty(len(classes), ranks.shape[1], dtype=torch.float64)
        for row, cls in enumerate(classes):
            positive = labels == cls
            p, n = int(positive.sum()), int((~positive).sum())
            if p == 0 or n == 0:
                raise ValueError(f"Class {int(cls)} has no {'negatives' if n == 0 else 'images'}.")
            auc[row] = (ranks[positive].sum(0) - p * (p + 1) / 2) / (p * n)
        return ClassDetectors(classes, auc.float())

    def mask_share(self, masks: Tensor, cover: float = 0.25, progress: bool = False) -> MaskShare:
        """How much of each latent's activation on patch tokens lies on the patches an object
        covers: masks (images, H, W) bool, one per stored image; a patch is the object's when
        at least ``cover`` of its pixels are. Reads the store's rows once more (not the data)."""
        on_object, is_patch = _object_tokens(self.store, torch.as_tensor(masks), cover)
        device = self.sae.W_dec.device
        inside = torch.zeros(self.sae.latents, dtype=torch.float64)
        total = torch.zeros(self.sae.latents, dtype=torch.float64)
        per_batch = _images_per_batch(self.store, self.sae)
        count = self.store.manifest["images"]
        for first in tqdm(range(0, count, per_batch), disable=not progress, unit="batch"):
            last = min(count, first + per_batch)
            rows = self.store.rows(first * self.store.tokens_per_image,
                                   last * self.store.tokens_per_image)  # fmt: skip
            with torch.no_grad(), eval_mode(self.sae):
                code = sparse_latents(self.sae, rows.to(device))
            value = code.value.double() * is_patch[first:last].flatten().to(device)[code.row]
            on = on_object[first:last].flatten().to(device)[code.row]
            inside += code.per_latent(value * on, self.sae.latents).cpu()
            total += code.per_latent(value, self.sae.latents).cpu()
        share = torch.where(total > 0, inside / total.clamp_min(1e-300), torch.nan)
        chance = float(on_object.sum() / is_patch.sum())
        return MaskShare(share.float(), chance, cover)


@dataclass(frozen=True)
class ClassDetectors:
    """``auc`` (classes, latents): how well each latent's per-image maximum detects each of
    ``classes`` (AUC 0.5: chance, 1: perfect)."""

    classes: Tensor
    auc: Tensor

    def best(self) -> list[tuple[int, int, float]]:
        """(class, latent, AUC) of the best detector of each class."""
        values, latents = self.auc.max(dim=1)
        return [(int(c), int(i), float(v))
                for c, i, v in zip(self.classes, latents, values, strict=True)]  # fmt: skip

    def detected(self, threshold: float = 0.9) -> int:
        """How many classes have a latent of AUC at least ``threshold``."""
        return int((self.auc.max(dim=1).values >= threshold).sum())


@dataclass(frozen=True)
class MaskShare:
    """``share`` (latents,): the fraction of each latent's activation on patch tokens that is on
    object patches (NaN for latents that never fire on a patch); ``chance``: the fraction of
    stored patches that are object patches (a latent blind to the object has about this share;
    the rest of an image is background and distractors)."""

    share: Tensor
    chance: float
    cover: float


def features(
    sae: SparseAutoencoder,
    store: ActivationStore | str | None = None,
    top: int = 16,
    image_bytes: int = IMAGE_BYTES,
    progress: bool = True,
) -> Features:
    """Each latent's density and largest activations over the rows of ``store`` (default: the
    store ``sae`` was trained on), one sequential pass; ``top``: how many patches and images
    to keep per latent; ``image_bytes``: the most the per-image maxima (images x latents
    float32) may take, kept only below it."""
    top = check_count("top", top)
    image_bytes = check_count("image_bytes", image_bytes, 0)
    store = _store_of(sae, store)
    tokens, count = store.tokens_per_image, store.manifest["images"]
    device, latents = sae.W_dec.device, sae.latents
    fired = torch.zeros(latents, dtype=torch.float64, device=device)
    sums = torch.zeros(latents, dtype=torch.float64, device=device)
    largest = torch.zeros(latents, device=device)
    top_rows = (torch.zeros(latents, 0, device=device),
                torch.zeros(latents, 0, dtype=torch.long, device=device))  # fmt: skip
    top_images = top_rows
    keep = count * latents * 4 <= image_bytes
    image_max = torch.zeros(count, latents) if keep else None
    per_batch = _images_per_batch(store, sae)
    for first in tqdm(range(0, count, per_batch), disable=not progress, unit="batch",
                      desc="features"):  # fmt: skip
        last = min(count, first + per_batch)
        with torch.no_grad(), eval_mode(sae):
            code = sparse_latents(sae, store.rows(first * tokens, last * tokens).to(device))
        fired += code.fired(latents)
        sums += code.per_latent(code.value.double(), latents)
        largest = torch.maximum(largest, code.per_latent(code.value, latents, "amax"))
        seen = min(top, last * tokens)
        top_rows = _merged_entries(top_rows, code, first * tokens, seen)
        per_image = code.image_max(tokens, latents)  # (images, latents)
        top_images = _merged(top_images, per_image.T, torch.arange(first, last, device=device),
                             top)  # fmt: skip
        if image_max is not None:
            image_max[first:last] = per_image.cpu()
    total = count * tokens
    return Features(
        sae, store, (fired / total).float().cpu(), (sums / fired.clamp_min(1)).float().cpu(),
        largest.cpu(), top_rows[0].cpu(), top_rows[1].cpu(), top_images[0].cpu(),
        top_images[1].cpu(), image_max,
    )  # fmt: skip


def _store_of(sae: SparseAutoencoder, store: ActivationStore | str | None) -> ActivationStore:
    if not sae.source:
        raise ValueError(
            "This autoencoder was trained on rows given as a tensor: there is no store to read "
            "its images and patches from. Train it on a store (vk.cache_activations)."
        )
    store = ActivationStore(sae.source["store"]) if store is None else store
    store = store if isinstance(store, ActivationStore) else ActivationStore(store)
    if sae.source["layer"] not in store.manifest["layers"]:
        raise ValueError(f"The store {store.folder} holds no {sae.source['layer']}.")
    store = store.layer(sae.source["layer"])
    check_source(sae, store.manifest["settings"], f"the store {store.folder}")
    return store


def _images_per_batch(store: ActivationStore, sae: SparseAutoencoder) -> int:
    """Whole images per batch whose latents (float32) fit in BATCH_BYTES."""
    return max(1, BATCH_BYTES // (store.tokens_per_image * sae.latents * 4))


def _merged_entries(
    kept: tuple[Tensor, Tensor], code: SparseLatents, first_row: int, top: int
) -> tuple[Tensor, Tensor]:
    """The ``top`` largest of the kept (latents, t) values and rows with the batch's non-zero
    entries (its rows numbered from ``first_row``): (latents, top) values, largest first, and
    their rows (-1 where fewer than ``top`` rows fired)."""
    latents = len(kept[0])
    held = kept[0] > 0
    owner = torch.arange(latents, device=held.device)[:, None].expand_as(held)[held]
    latent = torch.cat([owner, code.latent])
    value = torch.cat([kept[0][held], code.value])
    row = torch.cat([kept[1][held], code.row + first_row])
    order = value.argsort(descending=True, stable=True)
    order = order[latent[order].argsort(stable=True)]  # by latent, each largest first
    latent, value, row = latent[order], value[order], row[order]
    rank = torch.arange(len(latent), device=latent.device) - torch.searchsorted(latent, latent)
    chosen = rank < top
    values = value.new_zeros(latents, top)
    rows = torch.full((latents, top), -1, dtype=torch.long, device=value.device)
    values[latent[chosen], rank[chosen]] = value[chosen]
    rows[latent[chosen], rank[chosen]] = row[chosen]
    return values, rows


def _merged(kept: tuple[Tensor, Tensor], values: Tensor, labels: Tensor, top: int):
    """The ``top`` largest of the kept (latents, t) values with the batch's (latents, n)
    values (labelled by ``labels`` (n,)), and their labels."""
    both = torch.cat([kept[0], values], dim=1)
    names = torch.cat([kept[1], labels.expand(len(values), -1)], dim=1)
    best = both.topk(min(top, both.shape[1]), dim=1)
    return best.values, names.gather(1, best.indices)


def _object_tokens(store: ActivationStore, masks: Tensor, cover: float) -> tuple[Tensor, Tensor]:
    """(images, T) bool: which stored tokens are patches at least ``cover`` on the object;
    and (images, T) which are patches."""
    count, grid, prefix = store.manifest["images"], store.grid, store.prefix_tokens
    if masks.shape[0] != count or masks.ndim != 3:
        raise ValueError(
            f"masks must be (images, H, W) with one mask per stored image ({count}); got "
            f"{tuple(masks.shape)}."
        )
    if grid is None:
        raise ValueError(f"The store {store.folder} does not record its patch grid.")
    if store.frames is not None:
        raise ValueError(
            f"The store {store.folder} holds a video model's tokens ({store.frames} token "
            "frames); object masks are per image, so this is defined for stores of images only."
        )
    coverage = torch.nn.functional.adaptive_avg_pool2d(masks.float()[:, None], grid)
    patches = coverage.flatten(1) >= cover  # (images, gh * gw)
    positions = store.positions()  # (images, T)
    is_patch = positions >= prefix
    index = (positions - prefix).clamp_min(0)
    return patches.gather(1, index) & is_patch, is_patch
