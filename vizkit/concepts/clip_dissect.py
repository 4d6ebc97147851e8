"""CLIP-Dissect (Oikarinen and Weng 2023, "CLIP-Dissect: Automatic Description of Neuron
Representations in Deep Vision Networks", Sec. 3) of a ViT's units: each unit named after the
text of a concept set whose CLIP similarities over a probe set follow the unit's activations.

On N probe images and M concept texts, P (N, M) holds the CLIP model's cosine similarities of
each image with each text (both embeddings normalized). Unit k's summary q_k (N,) is the mean of
its activation map over the patch tokens of each image (the paper's spatial mean). Its
similarity with concept m is one of (the paper's Sec. 3 step 3 and Appendix A.4, as its
reference implementation computes them):

- ``cos``: cos(q_k, P[:, m]);
- ``cos^3``: the same after centring q_k and P[:, m] over the images, scaling them to unit
  standard deviation and cubing them (the reference centres only: the scale cancels in a
  cosine, except where its norm floor of 1e-3 shrinks a column of small spread);
- ``soft_wpmi`` (the paper's best, Eq. 4): with p(t_m|x) = softmax_m(P[x] / temperature) and
  B_k the ``top`` images of highest q_k, the j-th of them (j = 0 .. top-1) in B_k with
  probability p_j = `P_START` - (j / top)(`P_START` - `P_END`),
  log p(t_m|B_k) = sum_j log(1 + p_j (p(t_m|x_j) - 1) + `MIN_PROB`), log p(t_m) = log of the
  mean of p(t_m|B_i) over the U units dissected together, and
  soft-WPMI(t_m, q_k) = log p(t_m|B_k) - `LAMBDA` log p(t_m). As in the reference, p(t_m) is
  estimated over the units, so a unit's scores depend on the units dissected with it (alone,
  with `LAMBDA` 1, every score is 0).

A unit's name is its concept of highest similarity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.result import Result
from ..datasets.labelled import labelled_batches
from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count, check_number, unwrap_model
from ..models.zero_shot import image_tower
from ..sae.autoencoder import SparseAutoencoder
from ..store import ActivationStore
from ..targets import embed, encode_texts
from .dissection import CHUNK_BYTES
from .probe_set import ProbeSet, probe_set
from .units import Units, read_units

__all__ = [
    "LAMBDA", "MIN_PROB", "P_END", "P_START", "SIMILARITIES", "CLIPDissection", "clip_dissect",
    "cos_similarity", "cubed_cos_similarity", "soft_wpmi",
]  # fmt: skip

P_START = 0.998  # p(x in B_k) of the unit's most activating image (the reference's p_start)
P_END = 0.97  # where p(x in B_k) heads linearly down the top list (the reference's p_end)
MIN_PROB = 1e-7  # added to each probability before its log (the reference's min_prob)
LAMBDA = 1.0  # the weight of log p(t_m) in soft-WPMI (the paper's lambda)


def cos_similarity(activations: Tensor, image_text: Tensor) -> Tensor:
    """(U, M) cosine of each unit's summaries (N, U) with each text's similarities (N, M) over
    the images; 0 where either is all zeros."""
    return F.normalize(activations.double(), dim=0).T @ F.normalize(image_text.double(), dim=0)


def cubed_cos_similarity(activations: Tensor, image_text: Tensor) -> Tensor:
    """(U, M) `cos_similarity` of the columns of ``activations`` (N, U) and ``image_text``
    (N, M), each centred, scaled to unit standard deviation and cubed; 0 for a constant one."""
    return cos_similarity(_standardized(activations) ** 3, _standardized(image_text) ** 3)


def _standardized(values: Tensor) -> Tensor:
    """(N, C) each column less its mean, over its standard deviation (a constant column: 0)."""
    centred = values.double() - values.double().mean(0)
    return centred / centred.std(0).clamp_min(torch.finfo(torch.float64).tiny)


def soft_wpmi(activations: Tensor, image_text: Tensor, top: int, temperature: float) -> Tensor:
    """(U, M) soft-WPMI (Oikarinen and Weng 2023, Eq. 4) of each unit's summaries
    ``activations`` (N, U) with each text, of the cosine similarities ``image_text`` (N, M)."""
    given_image = torch.softmax(image_text.double() / temperature, dim=1)  # p(t_m|x): (N, M)
    chosen = activations.topk(top, dim=0).indices  # B_k: (top, U)
    in_top = P_START - torch.arange(top, dtype=torch.float64) / top * (P_START - P_END)
    step = max(1, CHUNK_BYTES // (8 * top * image_text.shape[1]))
    given_top = torch.cat([
        torch.log1p(in_top[:, None, None] * (given_image[chosen[:, units]] - 1) + MIN_PROB).sum(0)
        for units in _chunks(chosen.shape[1], step)
    ])  # log p(t_m|B_k): (U, M)  # fmt: skip
    prior = torch.logsumexp(given_top, dim=0) - math.log(len(given_top))  # log p(t_m): (M,)
    return given_top - LAMBDA * prior


def _chunks(count: int, step: int) -> Iterator[slice]:
    return (slice(start, start + step) for start in range(0, count, step))


SIMILARITIES: dict[str, Callable[..., Tensor]] = {
    "cos": lambda q, p, top, temperature: cos_similarity(q, p),
    "cos^3": lambda q, p, top, temperature: cubed_cos_similarity(q, p),
    "soft_wpmi": soft_wpmi,
}


@dataclass(repr=False)
class CLIPDissection(Result):
    """Each unit's similarity with each concept text (Oikarinen and Weng 2023, Sec. 3) and its
    name.

    Attributes:
        units: the U units' names ("<hook name> <channel>" or "latent <i>").
        concepts: the M concept texts.
        similarity: (U, M) each unit's similarity with each concept (``options["similarity"]``).
        labels: each unit's concept of highest similarity (the first of equals).
        best: (U,) that similarity.
    """

    units: list[str]
    concepts: list[str]
    similarity: Tensor
    labels: list[str]
    best: Tensor
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def table(self, k: int | None = None) -> list[tuple[str, str, float]]:
        """(unit, label, similarity) of the ``k`` units of highest similarity (all: None),
        highest first."""
        order = self.best.argsort(descending=True, stable=True)
        if k is not None:
            order = order[: check_count("k", k)]
        return [(self.units[i], self.labels[i], float(self.best[i])) for i in order.tolist()]


@analysis_contract
def clip_dissect(
    model: nn.Module | HookedModel,
    images: object,
    texts: Sequence[str],
    units: str | SparseAutoencoder,
    clip_model: nn.Module | None = None,
    tokenizer: object = None,
    *,
    image_text: Tensor | None = None,
    similarity: str = "soft_wpmi",
    top: int | None = None,
    temperature: float = 0.1,
    batch_size: int = 64,
    progress: bool = True,
    store: ActivationStore | None = None,
) -> CLIPDissection:
    """CLIP-Dissect of ``units`` of ``model`` with the concept ``texts`` on the probe ``images``.

    Args:
        images: (N, C, H, W) normalized for both models, or a Dataset or a DataLoader of images
            or (image, ...) tuples.
        texts: the M concept texts, distinct.
        units: a hook name whose activation is a token stream (B, N, C), each channel a unit;
            or a `vizkit.sae.SparseAutoencoder` trained on this model, each latent a unit.
        clip_model: the CLIP-family model whose similarities name the units (``model`` itself
            or another); or None with ``image_text``.
        tokenizer: ``clip_model``'s tokenizer, as `vizkit.targets.encode_texts` takes it.
        image_text: (N, M) the CLIP model's cosine similarities of the images with the texts,
            computed beforehand, instead of ``clip_model`` (the images in the same order).
        similarity: "soft_wpmi", "cos" or "cos^3" (`SIMILARITIES`).
        top: soft-WPMI's top list B_k (default max(5, N // 20), at most N).
        temperature: soft-WPMI's softmax temperature on cosine similarities (the reference's
            a = 10 is 0.1).
        batch_size: images per forward.
        progress: a progress bar over the images.
        store: an `vizkit.ActivationStore` of this model holding every patch token of the
            units' layer over the probe images: the activations are read from its rows (the
            images are still read by ``clip_model``; with ``image_text``, ``images`` may be
            None).

    Returns:
        `CLIPDissection`.
    """
    texts = _check_texts(texts)
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {list(SIMILARITIES)}; got {similarity!r}.")
    temperature = check_number("temperature", temperature, 0, low_open=True)
    batch_size = check_count("batch_size", batch_size)
    top = None if top is None else check_count("top", top)
    probes = probe_set(images, batch_size, "clip_dissect", store, need_images=image_text is None)
    text_embeddings = _text_embeddings(clip_model, tokenizer, texts, image_text)
    if image_text is not None:
        image_text = _check_image_text(image_text, probes.count, len(texts))
    image_size = _image_size(model, images, store)
    first = None if store is not None else next(probes.batches())[0][:1]
    found = read_units(model, units, image_size, first, store)
    bars = {"disable": not progress, "unit": "batch", "leave": False,
            "total": None if probes.count is None else -(-probes.count // batch_size)}  # fmt: skip
    tower = None if clip_model is None else image_tower(_unwrapped(clip_model))
    activations, similarities = _probe(found, probes, tower, text_embeddings, bars)
    image_text = similarities if image_text is None else _check_image_text(
        image_text, len(activations), len(texts))  # fmt: skip
    top = min(max(5, len(activations) // 20) if top is None else top, len(activations))
    scores = SIMILARITIES[similarity](activations, image_text.cpu(), top, temperature).float()
    best, index = scores.max(1)
    return CLIPDissection(
        found.names, texts, scores, [texts[i] for i in index.tolist()], best,
        options={"similarity": similarity, "top": top, "temperature": temperature,
                 "units": found.source, "layer": found.layer,
                 "clip": "image_text" if clip_model is None else "clip_model",
                 "store": None if store is None else str(store.folder)},
        layout=model.token_layout(image_size, found.layer), image_size=image_size,
    )  # fmt: skip


def _check_texts(texts: object) -> list[str]:
    """``texts`` as a list of one or more distinct non-blank strings."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a list of strings; got {type(texts).__name__}.")
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ValueError(f"texts must be one or more non-blank strings; got {texts!r}.")
    if len(set(texts)) != len(texts):
        raise ValueError("texts must be distinct: a repeated text would split its name's score.")
    return list(texts)


def _unwrapped(model: nn.Module | HookedModel) -> nn.Module:
    return unwrap_model(model.model if isinstance(model, HookedModel) else model)


def _text_embeddings(
    clip_model: nn.Module | None, tokenizer: object, texts: list[str], image_text: object
) -> Tensor | None:
    """(M, D) the normalized text embeddings by ``clip_model``; None with ``image_text``.
    Refuses both or neither."""
    if (clip_model is None) == (image_text is None):
        raise ValueError(
            "Give either clip_model (and its tokenizer), whose similarities name the units, or "
            "image_text, its (N, M) similarities computed beforehand; not both, not neither."
        )
    return None if clip_model is None else encode_texts(_unwrapped(clip_model), texts, tokenizer)


def _image_size(model: HookedModel, images: object, store: ActivationStore | None) -> tuple:
    """The probe images' (H, W): the store's, else the first image's."""
    if store is not None:
        return tuple(store.manifest["settings"]["image_size"])
    data = (images,) if isinstance(images, Tensor) else images
    return tuple(next(iter(labelled_batches(data, 1, "clip_dissect")[0]))[0].shape[-2:])


def _check_image_text(image_text: object, count: int | None, texts: int) -> Tensor:
    """``image_text`` as a finite (N, M) float tensor, N = ``count`` (unless unknown) and
    M = ``texts``."""
    if not isinstance(image_text, Tensor) or image_text.ndim != 2:
        got = tuple(image_text.shape) if isinstance(image_text, Tensor) else type(image_text)
        raise ValueError(f"image_text must be an (N, M) tensor; got {got}.")
    rows = len(image_text) if count is None else count
    if tuple(image_text.shape) != (rows, texts):
        raise ValueError(
            f"image_text is {tuple(image_text.shape)} but the probe set holds {count} images and "
            f"there are {texts} texts: give one row per image and one column per text."
        )
    if not bool(torch.isfinite(image_text).all()):
        raise ValueError("image_text holds values that are not finite.")
    return image_text.detach().float()


def _probe(
    units: Units, probes: ProbeSet, tower: nn.Module | None, texts: Tensor | None, bars: dict
) -> tuple[Tensor, Tensor | None]:
    """(N, U) each unit's mean activation over each image's patches and, with the CLIP image
    ``tower``, (N, M) each image's cosine similarity with each text embedding (M, D)."""
    activations, similarities = [], []
    for x, _, rows in tqdm(probes.batches(), desc="clip_dissect", **bars):
        activations.append(units.read(x, rows).mean((2, 3)).cpu())
        if tower is not None:
            image = F.normalize(embed(tower, x, len(x)).float(), dim=-1)
            similarities.append((image @ texts.to(image.device).T).cpu())
    return torch.cat(activations), torch.cat(similarities) if similarities else None
