"""Testing with Concept Activation Vectors (Kim, Wattenberg, Gilmer, Cai, Wexler, Viegas and
Sayres 2018, "Interpretability Beyond Feature Attribution: Quantitative Testing with Concept
Activation Vectors (TCAV)", ICML) at any hook name of a model.

A concept C is a set of images. Its CAV v_C^l at layer l is the unit normal of a linear
classifier that tells the activations f_l(x) of C's images from those of counterexamples,
pointing toward C (Sec. 3.2). The conceptual sensitivity of the target k to C at l on image x
is the directional derivative S_{C,k,l}(x) = grad h_{l,k}(f_l(x)) . v_C^l (Sec. 3.3, Eq. 1),
h_{l,k} the target's score as a function of the activation, and the TCAV score is the share of
the images with S > 0 (Sec. 3.4, Eq. 2). A CAV against one random set can score high by
chance, so R CAVs of C against R random sets are compared with R CAVs of random sets against
random sets by a two-sided t-test: C matters to k where p < alpha (Sec. 3.5).

Activations are flattened per image as captum flattens a layer output (``reshape(B, -1)``), so
a CAV holds one value per element of the activation. The classifier is scikit-learn's
``SGDClassifier(alpha=0.01, max_iter=1000, tol=1e-3)``, captum's default, seeded; its accuracy
is measured on a held-out share of each set (`held_out_split`). The target's gradient at the
layer is taken once per batch of images, by one backward pass, and dotted with every CAV.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.stats import ttest_ind
from sklearn.linear_model import SGDClassifier
from torch import Tensor, nn

from ..analysis.result import Result
from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import DEFAULT_MAX_BYTES, check_count, check_number
from ..hooks.scores import Target, class_indices, is_score_target, select_images, target_label
from .probe_set import ProbeSet, probe_set

__all__ = [
    "CAV", "TCAVResult", "concept_activation_vector", "concept_sensitivity", "held_out_split",
    "tcav",
]  # fmt: skip

CLASSIFIER = {"alpha": 0.01, "max_iter": 1000, "tol": 1e-3}  # captum's default SGDClassifier
SEPARATION = 0.1  # how much more accurate than random CAVs a concept's CAVs must be on average


@dataclass(frozen=True)
class CAV:
    """A concept activation vector (Kim et al. 2018, Sec. 3.2).

    Attributes:
        vector: (D,) float32, unit L2 norm, pointing toward the concept.
        layer: the hook name whose flattened activation (B, D) it lives in.
        accuracy: the classifier's accuracy on the held-out activations, in [0, 1].
    """

    vector: Tensor
    layer: str
    accuracy: float

    def __post_init__(self) -> None:
        vector = self.vector
        if not isinstance(vector, Tensor) or vector.ndim != 1 or not vector.is_floating_point():
            got = tuple(vector.shape) if isinstance(vector, Tensor) else type(vector).__name__
            raise TypeError(f"A CAV's vector must be a (D,) floating tensor; got {got}.")

    @property
    def dimension(self) -> int:
        """D, the values of one image's flattened activation."""
        return len(self.vector)


@dataclass(repr=False)
class TCAVResult(Result):
    """TCAV scores of a concept for a target, and their significance (Kim et al. 2018, Sec.
    3.4-3.5). Run r is the CAV of the concept against random set r.

    Attributes:
        layer: the hook name the CAVs live in.
        target: what was explained, as given (a class, one class per image, a score target's
            label, or None for each image's argmax).
        scores: (R,) each concept CAV's TCAV score: the share of images with S > 0.
        random_scores: (R,) the same for the CAV of random set r against random set r + 1.
        magnitudes: (R,) sum(S * (S > 0)) / sum(|S|) over the images: the share of the
            sensitivity that is positive, free of the CAV's scale (captum 0.9's
            ``magnitude`` is the plain mean of S instead, which scales with the CAV's norm).
        accuracies: (R,) each concept CAV's held-out accuracy.
        random_accuracies: (R,) each random CAV's.
        p_value: the two-sided t-test's of ``scores`` against ``random_scores``.
        significant: p_value < ``options["alpha"]``.
        sensitivities: (R, N) S_{C,k,l}(x) of each image for each concept CAV.
    """

    layer: str
    target: object
    scores: Tensor
    random_scores: Tensor
    magnitudes: Tensor
    accuracies: Tensor
    random_accuracies: Tensor
    p_value: float
    significant: bool
    sensitivities: Tensor
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    @property
    def score(self) -> float:
        """The mean TCAV score over the runs."""
        return float(self.scores.mean())


@dataclass
class _Budget:
    """The bytes the flattened activations may hold together (``max_bytes``)."""

    limit: int
    held: int = 0

    def hold(self, images: int, dimension: int, layer: str, what: str) -> None:
        """Count ``images`` flattened activations (float32) of ``what``; refuse above the
        limit."""
        self.held += images * dimension * 4
        if self.held > self.limit:
            raise ValueError(
                f"The flattened activations of {layer} ({dimension} values per image) would "
                f"hold {self.held:,} bytes with {what} ({images} images), above max_bytes="
                f"{self.limit:,}. Use fewer or smaller images per set, a narrower layer, or "
                "raise max_bytes."
            )


def held_out_split(count: int, share: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(held-out indices, fitted indices) of a set of ``count`` >= 2 images: a permutation
    ``torch.randperm(count, generator=generator)``, its first round(share * count) (at least
    1, at most count - 1) held out, the rest fitted in the permutation's order."""
    order = torch.randperm(count, generator=generator)
    held = min(count - 1, max(1, round(share * count)))
    return order[:held], order[held:]


@analysis_contract
def concept_activation_vector(
    model: nn.Module | HookedModel,
    concept: object,
    counterexamples: object,
    layer: str,
    *,
    seed: int = 0,
    batch_size: int = 64,
    test_share: float = 0.33,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> CAV:
    """The CAV of ``concept`` against ``counterexamples`` at ``layer`` (Kim et al. 2018, Sec.
    3.2).

    Args:
        concept: images of the concept (N, C, H, W) normalized for the model, or a Dataset or
            a non-shuffling DataLoader of them; at least 2.
        counterexamples: images without it, the same way; at least 2.
        layer: a hook name (``HookedModel(model).hook_names()``); its activation, any shape
            (B, ...), is flattened per image to (B, D).
        seed: seeds the held-out split (`held_out_split`, one generator for the concept, then
            the counterexamples) and the classifier.
        batch_size: images per forward.
        test_share: the share of each set held out to measure the accuracy, in (0, 1).
        max_bytes: the most the two sets' flattened activations may hold.

    Returns:
        `CAV`: the normalized ``coef_`` of ``SGDClassifier(alpha=0.01, max_iter=1000,
        tol=1e-3, random_state=seed)`` fitted on the concept (label 1) against the
        counterexamples (label 0).
    """
    seed, batch_size, test_share, max_bytes = _checked_options(seed, batch_size, test_share,
                                                               max_bytes)  # fmt: skip
    layer = model.tap(layer).name  # refuses an unknown name, listing the closest
    read = _SetReader(model, layer, batch_size, _Budget(max_bytes))
    positives = read(concept, "the concept")
    return _fitted_cav(positives, read(counterexamples, "the counterexamples"), layer, seed,
                       test_share)  # fmt: skip


@analysis_contract
def concept_sensitivity(
    model: nn.Module | HookedModel,
    images: object,
    target: Target,
    cav: CAV,
    *,
    batch_size: int = 64,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Tensor:
    """(N,) float32 S_{C,k,l}(x) = grad h_{l,k}(f_l(x)) . v_C^l of each image (Kim et al.
    2018, Sec. 3.3, Eq. 1): the derivative of the target's score along ``cav`` at its layer.

    Args:
        images: (N, C, H, W) normalized for the model, or a Dataset or a non-shuffling
            DataLoader of them.
        target: a class index, one per image, a score target (`vizkit.targets`, a callable on
            the output) or None for each image's argmax.
        cav: a `CAV` of this model at its ``layer``, for images of this size.
        max_bytes: the most one batch's activation and gradient may hold.
    """
    if not isinstance(cav, CAV):
        raise TypeError(
            f"cav must be a CAV (vk.concepts.concept_activation_vector); got {type(cav).__name__}."
        )
    explained = probe_set(images, check_count("batch_size", batch_size), "concept_sensitivity")
    targets = _per_image(target, explained.count)
    layer = model.tap(cav.layer).name
    sensitivities, _ = _sensitivities(model, explained, targets, layer, cav.vector[None],
                                      check_count("max_bytes", max_bytes))  # fmt: skip
    return sensitivities[0]


@analysis_contract
def tcav(
    model: nn.Module | HookedModel,
    images: object,
    target: Target,
    layer: str,
    concept: object,
    randoms: list,
    *,
    seed: int = 0,
    batch_size: int = 64,
    alpha: float = 0.05,
    test_share: float = 0.33,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> TCAVResult:
    """TCAV of ``concept`` for ``target`` at ``layer`` on ``images``, with its significance
    (Kim et al. 2018, Sec. 3.3-3.5).

    Args:
        images: the images explained (N, C, H, W) normalized for the model, or a Dataset or a
            non-shuffling DataLoader of them (e.g. images of the target class).
        target: a class index, one per image, a score target (`vizkit.targets`, a callable on
            the output) or None for each image's argmax.
        layer: a hook name; its activation (B, ...) is flattened per image.
        concept: images of the concept, as ``images``; at least 2.
        randoms: R >= 2 random sets of images, each as ``images``, at least 2 images each.
        seed: of every CAV's held-out split and classifier (`concept_activation_vector`).
        batch_size: images per forward (and per backward, for ``images``).
        alpha: the significance level of the t-test, in (0, 1).
        test_share: the share of each set held out to measure a CAV's accuracy.
        max_bytes: the most the flattened activations of the concept and random sets may hold.

    Returns:
        `TCAVResult`. Run r fits the concept against ``randoms[r]`` and the random CAV
        ``randoms[r]`` against ``randoms[(r + 1) % R]``; each is
        ``concept_activation_vector(model, a, b, layer, seed=seed, test_share=test_share)``.
        The p-value is scipy's
        ``ttest_ind`` of the R concept scores against the R random scores: NaN where both are
        constant and equal (nothing to test), 0 where both are constant and differ.
    """
    seed, batch_size, test_share, max_bytes = _checked_options(seed, batch_size, test_share,
                                                               max_bytes)  # fmt: skip
    alpha = check_number("alpha", alpha, 0, 1, low_open=True, high_open=True)
    randoms = _checked_randoms(randoms)
    layer = model.tap(layer).name
    explained = probe_set(images, batch_size, "tcav")
    targets = _per_image(target, explained.count)  # refuses a class count off the images'
    read = _SetReader(model, layer, batch_size, _Budget(max_bytes))
    cavs, random_cavs = _run_cavs(read, concept, randoms, seed, test_share)
    vectors = torch.stack([c.vector for c in [*cavs, *random_cavs]])  # (2R, D)
    sensitivities, image_size = _sensitivities(model, explained, targets, layer, vectors,
                                               max_bytes)  # fmt: skip
    count = len(cavs)
    scores = (sensitivities > 0).float().mean(1)  # (2R,)
    p_value = _p_value(scores[:count], scores[count:])
    _warn_unseparated(cavs, random_cavs, layer)
    return TCAVResult(
        layer, _recorded(target), scores[:count], scores[count:],
        _magnitudes(sensitivities[:count]), torch.tensor([c.accuracy for c in cavs]),
        torch.tensor([c.accuracy for c in random_cavs]), p_value, bool(p_value < alpha),
        sensitivities[:count],
        options={"seed": seed, "batch_size": batch_size, "alpha": alpha,
                 "test_share": test_share, "runs": count, "images": sensitivities.shape[1],
                 "classifier": {**CLASSIFIER, "random_state": seed}},
        layout=model.token_layout(image_size, layer), image_size=image_size,
    )  # fmt: skip


def _warn_unseparated(cavs: list[CAV], random_cavs: list[CAV], layer: str) -> None:
    """Warn where the concept's CAVs are on average less than `SEPARATION` more accurate than
    the random CAVs: the concept is then no more linearly separable at ``layer`` than noise,
    and its score (significant or not) says little (Kim et al. 2018, Sec. 3.5: read the CAVs'
    accuracy beside the score)."""
    concept = sum(c.accuracy for c in cavs) / len(cavs)
    chance = sum(c.accuracy for c in random_cavs) / len(random_cavs)
    if concept < chance + SEPARATION:
        warnings.warn(
            f"The concept's CAVs are {concept:.2f} accurate on held-out activations, random "
            f"CAVs {chance:.2f}: the concept is not linearly separable at {layer}, so its TCAV "
            "score says little. Try another layer or more (and more distinct) concept images.",
            stacklevel=3,
        )


def _checked_options(
    seed: object, batch_size: object, test_share: object, max_bytes: object
) -> tuple[int, int, float, int]:
    """The options both fitting functions take, range-checked."""
    return (check_count("seed", seed, 0), check_count("batch_size", batch_size),
            check_number("test_share", test_share, 0, 1, low_open=True, high_open=True),
            check_count("max_bytes", max_bytes))  # fmt: skip


def _checked_randoms(randoms: object) -> list:
    """``randoms`` as a list of R >= 2 sets of images."""
    if not isinstance(randoms, (list, tuple)):
        shape = tuple(randoms.shape) if isinstance(randoms, Tensor) else None
        got = type(randoms).__name__ if shape is None else f"a {shape} tensor"
        raise TypeError(
            "randoms must be a list of random sets of images (each (N, C, H, W), a Dataset or a "
            f"DataLoader); got {got}. Split "
            "one tensor of random images into sets: list(images.chunk(R))."
        )
    if len(randoms) < 2:
        raise ValueError(
            f"randoms holds {len(randoms)} set(s); the significance test (Kim et al. 2018, "
            "Sec. 3.5) needs R >= 2 random sets (random CAVs are fitted between them). Pass "
            "more, e.g. list(random_images.chunk(R)); Kim et al. use tens."
        )
    return list(randoms)


def _batches(probes: ProbeSet, what: str) -> Iterator[tuple[Tensor, range]]:
    """Each batch of ``probes`` (B, C, H, W) and its rows; refuses a set without images."""
    rows = range(0)
    for x, _, rows in probes.batches():
        yield x, rows
    if rows.stop == 0:
        raise ValueError(f"No images in {what}; pass at least 2 (N, C, H, W) images.")


@dataclass
class _SetReader:
    """Reads sets of images as ``layer``'s flattened activations, all within one budget."""

    hm: HookedModel
    layer: str
    batch_size: int
    budget: _Budget

    def __call__(self, images: object, what: str) -> Tensor:
        """(N, D) float32 on the CPU: the activation of each image of ``images`` (``what``:
        "the concept", ...), flattened (``reshape(B, -1)``); refuses fewer than 2 images."""
        probes = probe_set(images, self.batch_size, "tcav")
        parts = []
        for x, _ in _batches(probes, what):
            with torch.no_grad():
                _, cache = self.hm.run_with_cache(x, [self.layer], device="cpu",
                                                  max_bytes=self.budget.limit)  # fmt: skip
            flat = cache[self.layer].reshape(len(x), -1).float()
            if not parts or probes.count is None:  # the whole set at once where it is sized
                self.budget.hold(probes.count or len(flat), flat.shape[1], self.layer, what)
            parts.append(flat)
        found = torch.cat(parts)
        if len(found) < 2:
            raise ValueError(
                f"Only 1 image in {what}; a CAV needs at least 2 per set (one to fit, one to "
                "measure its accuracy), Kim et al. use about 50."
            )
        return found


def _fitted_cav(
    positives: Tensor, negatives: Tensor, layer: str, seed: int, test_share: float
) -> CAV:
    """The CAV of the activations ``positives`` (P, D) against ``negatives`` (Q, D)."""
    if positives.shape[1] != negatives.shape[1]:
        raise ValueError(
            f"The concept's activations of {layer} have {positives.shape[1]} values per image, "
            f"the counterexamples' {negatives.shape[1]}: give images of one size."
        )
    generator = torch.Generator().manual_seed(seed)
    held_p, fit_p = held_out_split(len(positives), test_share, generator)
    held_n, fit_n = held_out_split(len(negatives), test_share, generator)
    classifier = SGDClassifier(**CLASSIFIER, random_state=seed)
    classifier.fit(*_labelled(positives[fit_p], negatives[fit_n]))
    coef = torch.from_numpy(classifier.coef_[0])  # float64, toward label 1
    norm = coef.norm()
    if not bool(norm > 0):
        raise ValueError(
            f"The classifier found no direction at {layer} (every weight 0): the concept's "
            "and the counterexamples' activations are not told apart there. Give sets that "
            "differ in the concept, or another layer."
        )
    accuracy = classifier.score(*_labelled(positives[held_p], negatives[held_n]))
    return CAV((coef / norm).float(), layer, float(accuracy))


def _labelled(positives: Tensor, negatives: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(P + Q, D) float64 activations and their labels: 1 for ``positives``, 0 after."""
    x = torch.cat([positives, negatives]).double().numpy()
    y = np.r_[np.ones(len(positives), dtype=np.int64), np.zeros(len(negatives), dtype=np.int64)]
    return x, y


def _run_cavs(
    read: _SetReader, concept: object, randoms: list, seed: int, test_share: float
) -> tuple[list[CAV], list[CAV]]:
    """The R CAVs of the concept against each random set, and the R CAVs of random set r
    against random set (r + 1) % R; each set's activations are read once."""
    positives = read(concept, "the concept")
    negatives = [read(images, f"randoms[{r}]") for r, images in enumerate(randoms)]
    count = len(negatives)
    cavs = [_fitted_cav(positives, n, read.layer, seed, test_share) for n in negatives]
    random_cavs = [
        _fitted_cav(negatives[r], negatives[(r + 1) % count], read.layer, seed, test_share)
        for r in range(count)
    ]
    return cavs, random_cavs


def _sensitivities(
    hm: HookedModel, explained: ProbeSet, targets: Callable[[range], Target], layer: str,
    vectors: Tensor, max_bytes: int,
) -> tuple[Tensor, tuple[int, int]]:  # fmt: skip
    """(V, N) float32 S of each explained image along each of ``vectors`` (V, D): the gradient
    of the target's score at ``layer`` (one backward per batch), flattened, dotted with each
    (in float64); and the images' (H, W)."""
    parts = []
    for x, rows in _batches(explained, "the images explained"):
        _, cache = hm.run_with_cache(x, [layer], grads=True, target=targets(rows),
                                     device="cpu", max_bytes=max_bytes)  # fmt: skip
        gradient = cache[f"{layer}_grad"].reshape(len(x), -1)
        if gradient.shape[1] != vectors.shape[1]:
            raise ValueError(
                f"The CAV has {vectors.shape[1]} values but {layer} flattens to "
                f"{gradient.shape[1]} on these {tuple(x.shape[-2:])} images: fit the CAV at "
                "this layer of this model, on images of the size explained."
            )
        parts.append((gradient.double() @ vectors.double().T).float())  # (B, V)
    return torch.cat(parts).T, (int(x.shape[-2]), int(x.shape[-1]))


def _per_image(target: Target, count: int | None) -> Callable[[range], Target]:
    """rows -> the target of the images ``rows`` of the explained set: a score target's for
    those images, their slice of one class per image, an int class or None as it is."""
    if is_score_target(target):
        return lambda rows: select_images(target, torch.arange(rows.start, rows.stop))
    if target is None or isinstance(target, numbers.Integral):
        return lambda rows: target
    if count is None:
        raise ValueError(
            "One class per image needs to know how many images there are; the images' data "
            "set has no length. Pass them as a tensor or a sized Dataset, or one int target."
        )
    classes = class_indices(target, count)  # refuses another count than the images'
    return lambda rows: classes[rows.start : rows.stop]


def _magnitudes(sensitivities: Tensor) -> Tensor:
    """(R,) sum(S * (S > 0)) / sum(|S|) of each row of ``sensitivities`` (R, N); NaN where
    every S is 0."""
    positive = sensitivities.clamp_min(0).double().sum(1)
    total = sensitivities.abs().double().sum(1)
    return torch.where(total > 0, positive / total.clamp_min(1e-300), math.nan).float()


def _p_value(scores: Tensor, random_scores: Tensor) -> float:
    """The two-sided t-test's p-value of ``scores`` against ``random_scores`` (both (R,)):
    NaN where both are constant and equal, 0 where both are constant and differ. Scores are
    shares of N images, often constant within a group (every image positive: 1.0), which scipy
    takes for values equal up to rounding and warns of; they are exact, so that is silenced."""
    if bool((scores == scores[0]).all() and (random_scores == random_scores[0]).all()):
        return math.nan if bool(scores[0] == random_scores[0]) else 0.0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        return float(ttest_ind(scores.double().numpy(), random_scores.double().numpy()).pvalue)


def _recorded(target: Target) -> object:
    """``target`` as the result records it, in JSON types: a score target by its label, one
    class as an int, one per image as a list of ints."""
    if target is None or is_score_target(target):
        return target_label(target)
    if isinstance(target, numbers.Integral):
        return int(target)
    if isinstance(target, Tensor):
        return target.reshape(-1).tolist()
    return np.asarray(target).reshape(-1).tolist()
