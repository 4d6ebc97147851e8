"""One-dimensional probes of units against patch labels, as saev evaluates sparse
autoencoders (Stevens et al., saev: "Sparse autoencoders for vision", its 1-D probe and the
metrics its trait-discovery notebooks report).

For each unit f and class c a logistic probe p = sigmoid(b + w x_f) is fitted on the training
patches (x_f: the unit's value at a patch; label 1 where the patch's label is c), minimizing
the mean binary cross-entropy plus ridge / 2 (w^2 + (b - b0)^2), b0 the logit of the class's
share, by damped Newton steps (Levenberg-Marquardt). Patches where a unit is 0 (most, for an
autoencoder's latents) enter in closed form. Each class is given the unit of lowest training
loss, and on the test patches:

- Probe R = 1 - mean_c CE(f_c, c) / mean_c H(pi_c): the best units' cross-entropy against that
  of predicting each class's test share pi_c (H: the binary entropy), over the classes present;
- AP_c: the average precision of ranking test patches by b + w x_{f_c}, ties grouped as
  scikit-learn's `average_precision_score` groups them; mAP their mean over the classes with
  test patches (saev counts an absent class as AP 0; here it has none);
- purity@k of a unit: the share of the most frequent label among its k largest nonzero test
  values (NaN for a unit with fewer than k); reported for each class's unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.result import Result
from ..hooks import HookedModel
from ..hooks.contract import analysis_contract
from ..hooks.inputs import DEFAULT_MAX_BYTES, check_count, check_number
from ..sae.autoencoder import SparseAutoencoder
from ..store import ActivationStore
from .probe_set import probe_set
from .units import Units, read_units

__all__ = ["PURITY_K", "PatchLabels", "Probes", "patch_labels", "probe_units"]

PURITY_K = (16, 64, 256)
ENTRY_CHUNK = 2**20  # (unit, patch) values per step of a pass over the probes' data
DENSE_SHARE = 0.25  # units nonzero on more of the (unit, patch) pairs are held dense


@dataclass
class PatchLabels:
    """A class per patch of each image.

    Attributes:
        classes: the K classes' names.
        labels: (N, gh, gw) int64 in [0, K), patch (i, j) of image n's class.
    """

    classes: list[str]
    labels: Tensor

    def __post_init__(self) -> None:
        labels = self.labels
        if not isinstance(labels, Tensor) or labels.ndim != 3 or labels.dtype != torch.int64:
            raise TypeError("PatchLabels.labels must be an (N, gh, gw) int64 tensor.")
        if len(labels) == 0 or labels.min() < 0 or labels.max() >= len(self.classes):
            raise ValueError(
                f"Patch labels must be class indices in [0, {len(self.classes)}) of one or more "
                "images."
            )
        if len(set(self.classes)) != len(self.classes):
            raise ValueError(f"Class names must be distinct; got {self.classes}.")
        self.classes = list(self.classes)


def patch_labels(pixels: Tensor, grid: tuple[int, int], classes: list[str]) -> PatchLabels:
    """Each patch's majority class of the pixel classes ``pixels`` (N, H, W) int64 over a
    ``grid`` (gh, gw) of equal patches (saev's majority rule; ties: the lowest class)."""
    n, height, width = pixels.shape
    gh, gw = grid
    if height % gh or width % gw:
        raise ValueError(f"{height}x{width} pixels do not split into a {gh}x{gw} grid.")
    patches = pixels.view(n, gh, height // gh, gw, width // gw).permute(0, 1, 3, 2, 4)
    counts = torch.nn.functional.one_hot(patches.flatten(3), len(classes)).sum(3)
    return PatchLabels(classes, counts.argmax(-1))


@dataclass(repr=False)
class Probes(Result):
    """1-D probes of each unit for each class, and saev's metrics on the test patches.

    Attributes:
        units: the U units' names; ``classes``: the K classes.
        weights, biases: (U, K) each probe's w and b.
        train_loss, test_loss: (U, K) each probe's mean cross-entropy on the patches.
        best: (K,) each class's unit (lowest training loss).
        probe_r: Probe R on the test patches.
        ap: (K,) each class's average precision by its unit (NaN: no test patch of it).
        purity: (K, len(purity_k)) purity@k of each class's unit.
        test_share: (K,) each class's share of the test patches.
    """

    units: list[str]
    classes: list[str]
    weights: Tensor
    biases: Tensor
    train_loss: Tensor
    test_loss: Tensor
    best: Tensor
    probe_r: float
    ap: Tensor
    purity: Tensor
    test_share: Tensor
    purity_k: tuple[int, ...] = PURITY_K
    options: dict = field(default_factory=dict)

    @property
    def mean_ap(self) -> float:
        """The mean AP over the classes with test patches."""
        return float(self.ap[~self.ap.isnan()].mean())

    def table(self) -> list[tuple[str, str, float, float]]:
        """(class, its unit, its AP, its purity at the first k) for each class."""
        return [(c, self.units[int(u)], float(a), float(p))
                for c, u, a, p in zip(self.classes, self.best, self.ap, self.purity[:, 0],
                                      strict=True)]  # fmt: skip


@dataclass
class _Patches:
    """A split's patch values: as (unit, patch) entries where the units are sparse (``unit``,
    ``patch`` (E,) int64, ``value`` (E,) float32), else ``dense`` (P, U) float32 (every patch
    an entry); the patches' ``labels`` (P,) and the count of units U."""

    unit: Tensor
    patch: Tensor
    value: Tensor
    labels: Tensor
    units: int
    dense: Tensor | None = None

    def counts(self) -> Tensor:
        """(U,) the entries of each unit."""
        if self.dense is not None:
            return torch.full((self.units,), len(self.labels))
        return torch.bincount(self.unit, minlength=self.units)

    def column(self, unit: int) -> Tensor:
        """(P,) ``unit``'s value at every patch (0 where it did not fire)."""
        if self.dense is not None:
            return self.dense[:, unit]
        values = torch.zeros(len(self.labels))
        mine = self.unit == unit
        values[self.patch[mine]] = self.value[mine]
        return values


@analysis_contract
def probe_units(
    model: nn.Module | HookedModel,
    units: str | SparseAutoencoder,
    images: object,
    labels: PatchLabels,
    test_images: object,
    test_labels: PatchLabels,
    *,
    ridge: float = 1e-8,
    steps: int = 30,
    purity_k: tuple[int, ...] = PURITY_K,
    batch_size: int = 64,
    store: ActivationStore | None = None,
    test_store: ActivationStore | None = None,
    progress: bool = True,
) -> Probes:
    """saev's 1-D probes of ``units`` of ``model``: fitted on ``images`` with their patch
    ``labels``, measured on ``test_images`` with ``test_labels``.

    Args:
        units: a hook name whose activation is a token stream (B, N, C), each channel a unit;
            or a `vizkit.sae.SparseAutoencoder` trained on this model, each latent a unit.
        images, test_images: (N, C, H, W) normalized for the model, or a Dataset or a
            non-shuffling DataLoader; None with ``store`` / ``test_store``.
        labels, test_labels: `PatchLabels` of the same classes, on the layer's patch grid.
        ridge: the penalty on (w, b - b0); steps: Newton steps at most.
        purity_k: the k of purity@k.
        store, test_store: `vizkit.ActivationStore`s of the two splits to read the units from.

    Returns:
        `Probes`.
    """
    ridge = check_number("ridge", ridge, 0)
    steps = check_count("steps", steps)
    purity_k = tuple(check_count("purity_k", k) for k in purity_k)
    if labels.classes != test_labels.classes:
        raise ValueError(
            f"The splits' classes differ ({labels.classes} vs {test_labels.classes}); label "
            "both with the same classes in the same order."
        )
    bars = {"disable": not progress, "leave": False, "unit": "batch"}
    found, train = _read(model, units, images, labels, store, batch_size, "train", bars)
    test = _read(model, units, test_images, test_labels, test_store, batch_size, "test", bars)[1]
    classes = len(labels.classes)
    weights, biases, train_loss = _fit(train, classes, ridge, steps, bars)
    test_loss = _losses(test, classes, weights, biases)
    best = train_loss.argmin(0)  # (K,)
    share = torch.bincount(test.labels, minlength=classes).double() / len(test.labels)
    present = share > 0
    columns = torch.arange(classes)
    chosen_loss = test_loss[best, columns].double()
    entropy = -(torch.xlogy(share, share) + torch.xlogy(1 - share, 1 - share))  # H(pi_c)
    probe_r = 1 - float(chosen_loss[present].mean() / entropy[present].mean())
    ap = _average_precision(test, best, weights[best, columns], biases[best, columns])
    purity = _purity(test, best, purity_k)
    return Probes(
        found.names, labels.classes, weights.float(), biases.float(), train_loss.float(),
        test_loss.float(), best, probe_r, ap.float(), purity.float(), share.float(), purity_k,
        options={"layer": found.layer, "units": found.source, "ridge": ridge, "steps": steps,
                 "train_patches": len(train.labels), "test_patches": len(test.labels)},
    )  # fmt: skip


def _read(
    model: HookedModel, units: object, images: object, labels: PatchLabels,
    store: ActivationStore | None, batch_size: int, split: str, bars: dict,
) -> tuple[Units, _Patches]:  # fmt: skip
    """The split's units and their nonzero values at each patch, checked against ``labels``."""
    if not isinstance(labels, PatchLabels):
        raise TypeError(f"The {split} labels must be PatchLabels; got {type(labels).__name__}.")
    probes = probe_set(images, batch_size, "probe_units", store)
    if probes.count is not None and probes.count != len(labels.labels):
        raise ValueError(
            f"The {split} split holds {probes.count} images but {len(labels.labels)} images' "
            "patch labels; give one label grid per image."
        )
    first = None if store is not None else next(probes.batches())[0][:1]
    image_size = tuple(store.manifest["settings"]["image_size"]) if first is None else tuple(
        first.shape[-2:])  # fmt: skip
    found = read_units(model, units, image_size, first, store)
    grid = model.token_layout(image_size, found.layer).grid
    if tuple(labels.labels.shape[1:]) != tuple(grid):
        raise ValueError(
            f"The {split} patch labels are {tuple(labels.labels.shape[1:])} per image but "
            f"{found.layer} has a {grid[0]}x{grid[1]} patch grid; label its patches "
            "(vk.concepts.patch_labels)."
        )
    parts, patches = [], grid[0] * grid[1]
    kept = 0
    for x, _, rows in tqdm(probes.batches(), desc=f"probe_units: {split}", **bars):
        values = found.read(x, rows).flatten(2).transpose(1, 2).flatten(0, 1).cpu()  # (B * Np, U)
        patch, unit = values.nonzero(as_tuple=True)
        kept += len(patch)
        if kept * 20 > DEFAULT_MAX_BYTES:
            raise ValueError(
                f"The {split} split's nonzero unit values exceed "
                f"{DEFAULT_MAX_BYTES / 2**30:.0f} GiB; probe fewer images or units."
            )
        parts.append((unit, patch + rows.start * patches, values[patch, unit]))
    unit, patch, value = (torch.cat(p) for p in zip(*parts, strict=True))
    flat, count = labels.labels.flatten(), len(found.names)
    if len(unit) < DENSE_SHARE * len(flat) * count:
        return found, _Patches(unit, patch, value.float(), flat, count)
    dense = torch.zeros(len(flat), count)
    dense[patch, unit] = value.float()
    empty = torch.empty(0, dtype=torch.long)
    return found, _Patches(empty, empty, torch.empty(0), flat, count, dense)


def _sums(data: _Patches, classes: int, w: Tensor, b: Tensor) -> dict[str, Tensor]:
    """(U, K) per probe, over the patches where the unit is nonzero: the cross-entropy, the
    residual mu - y and the curvature s = mu (1 - mu) times 1, x and x^2; and the positive
    patches among them."""
    shape = (data.units, classes)
    sums = {k: torch.zeros(shape, dtype=torch.float64)
            for k in ("loss", "r", "rx", "s", "sx", "sxx", "y")}  # fmt: skip
    if data.dense is not None:
        return _dense_sums(data, classes, w, b, sums)
    step = max(1, ENTRY_CHUNK // classes)
    for start in range(0, len(data.unit), step):
        unit = data.unit[start : start + step]
        x = data.value[start : start + step, None].double()
        y = torch.nn.functional.one_hot(data.labels[data.patch[start : start + step]],
                                        classes).double()  # fmt: skip
        logit = b[unit] + w[unit] * x
        mu = torch.sigmoid(logit)
        s = mu * (1 - mu)
        parts = {"loss": torch.nn.functional.softplus(logit) - y * logit, "r": mu - y,
                 "rx": (mu - y) * x, "s": s, "sx": s * x, "sxx": s * x * x, "y": y}  # fmt: skip
        for key, value in parts.items():
            sums[key].index_add_(0, unit, value)
    return sums


def _dense_sums(
    data: _Patches, classes: int, w: Tensor, b: Tensor, sums: dict[str, Tensor]
) -> dict[str, Tensor]:
    """`_sums` over every patch of dense units, chunks of patches at a time: each term in
    float32 (the bulk of the work), their sums in float64."""
    step = max(1, ENTRY_CHUNK // (data.units * classes))
    w32, b32 = w.float(), b.float()
    for start in range(0, len(data.labels), step):
        x = data.dense[start : start + step, :, None]  # (p, U, 1)
        labels = data.labels[start : start + step]
        y = torch.nn.functional.one_hot(labels, classes).float()[:, None]  # (p, 1, K)
        logit = b32 + w32 * x  # (p, U, K)
        mu = torch.sigmoid(logit)
        s = mu * (1 - mu)
        r = mu - y
        sx = s * x
        for key, term in (("loss", torch.nn.functional.softplus(logit) - y * logit), ("r", r),
                          ("rx", r * x), ("s", s), ("sx", sx), ("sxx", sx * x)):  # fmt: skip
            sums[key] += term.sum(0, dtype=torch.float64)
        sums["y"] += torch.bincount(labels, minlength=classes).double()
    return sums


def _objective(
    data: _Patches, classes: int, w: Tensor, b: Tensor, b0: Tensor, ridge: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(U, K) the penalized mean loss, (U, K, 2) its gradient and (U, K, 2, 2) Hessian in
    (b, w); the patches where a unit is 0 enter in closed form."""
    patches = len(data.labels)
    sums = _sums(data, classes, w, b)
    zeros = (patches - data.counts()).double()[:, None]
    positives = torch.bincount(data.labels, minlength=classes).double()[None]
    zero_positive = positives - sums["y"]  # patches where the unit is 0 and the label is c
    mu0, s0 = torch.sigmoid(b), torch.sigmoid(b) * torch.sigmoid(-b)
    zero_loss = zeros * torch.nn.functional.softplus(b) - zero_positive * b
    penalty = 0.5 * ridge * (w**2 + (b - b0) ** 2)
    loss = (sums["loss"] + zero_loss) / patches + penalty
    gradient = torch.stack([(sums["r"] + zeros * mu0 - zero_positive) / patches
                            + ridge * (b - b0), sums["rx"] / patches + ridge * w], -1)  # fmt: skip
    hbb = (sums["s"] + zeros * s0) / patches + ridge
    hbw = sums["sx"] / patches
    hww = sums["sxx"] / patches + ridge
    hessian = torch.stack([torch.stack([hbb, hbw], -1), torch.stack([hbw, hww], -1)], -2)
    return loss, gradient, hessian


def _fit(
    data: _Patches, classes: int, ridge: float, steps: int, bars: dict
) -> tuple[Tensor, Tensor, Tensor]:
    """(U, K) w, b and the unpenalized mean training loss of every probe, by Newton steps
    damped as Levenberg-Marquardt (a step that raises a probe's loss is taken back and its
    damping raised tenfold; one that lowers it, lowered tenfold)."""
    share = torch.bincount(data.labels, minlength=classes).double() / len(data.labels)
    b0 = torch.logit(share.clamp(1e-8, 1 - 1e-8))[None].expand(data.units, classes).clone()
    w, b = torch.zeros_like(b0), b0.clone()
    loss, gradient, hessian = _objective(data, classes, w, b, b0, ridge)
    damping = torch.full_like(b0, 1e-3)
    for _ in tqdm(range(steps), desc="probe_units: fit", **bars):
        scaled = hessian + damping[..., None, None] * torch.diag_embed(
            hessian.diagonal(dim1=-2, dim2=-1))  # fmt: skip
        step = torch.linalg.solve(scaled, -gradient[..., None])[..., 0]
        trial = _objective(data, classes, w + step[..., 1], b + step[..., 0], b0, ridge)
        better = trial[0] <= loss
        w = torch.where(better, w + step[..., 1], w)
        b = torch.where(better, b + step[..., 0], b)
        loss = torch.where(better, trial[0], loss)
        gradient = torch.where(better[..., None], trial[1], gradient)
        hessian = torch.where(better[..., None, None], trial[2], hessian)
        damping = torch.where(better, damping / 10, damping * 10).clamp(1e-12, 1e12)
        if bool((step.abs().amax(-1) < 1e-9).all()):
            break
    return w, b, _losses(data, classes, w, b)


def _losses(data: _Patches, classes: int, w: Tensor, b: Tensor) -> Tensor:
    """(U, K) each probe's mean cross-entropy over the split's patches."""
    return _objective(data, classes, w, b, b, 0.0)[0]


def _average_precision(data: _Patches, best: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """(K,) the average precision of ranking the patches by each class's probe, b + w x,
    tied scores as one threshold; NaN for a class without test patches."""
    ap = torch.full((len(best),), torch.nan, dtype=torch.float64)
    for c, unit in enumerate(best.tolist()):
        positive = data.labels == c
        if not bool(positive.any()):
            continue
        score = b[c].double() + w[c].double() * data.column(unit).double()
        order = score.argsort(descending=True, stable=True)
        score, hit = score[order], positive[order].double()
        last = torch.ones(len(score), dtype=torch.bool)  # the last patch of each tie group
        last[:-1] = score[1:] != score[:-1]
        hits, seen = hit.cumsum(0)[last], torch.arange(1, len(score) + 1)[last].double()
        recall = hits / hits[-1]
        gained = torch.diff(recall, prepend=torch.zeros(1))
        ap[c] = (gained * hits / seen).sum()
    return ap


def _purity(data: _Patches, best: Tensor, purity_k: tuple[int, ...]) -> Tensor:
    """(K, len(purity_k)) the share of the most frequent label among each class's unit's k
    largest nonzero values (NaN where it has fewer than k)."""
    purity = torch.full((len(best), len(purity_k)), torch.nan, dtype=torch.float64)
    for c, unit in enumerate(best.tolist()):
        column = data.column(unit)
        fired = (column != 0).nonzero().flatten()  # patches in order
        order = column[fired].argsort(descending=True, stable=True)
        labels = data.labels[fired[order]]
        for j, k in enumerate(purity_k):
            if len(labels) >= k:
                purity[c, j] = torch.bincount(labels[:k]).max() / k
    return purity
