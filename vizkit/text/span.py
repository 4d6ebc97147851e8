"""Each head described by a few texts: TextSpan (Gandelsman, Efros and Steinhardt 2024,
"Interpreting CLIP's Image Representation via Text-Based Decomposition", Sec. 4.1, Alg. 1).

Over a data set, a head's direct contributions to the image embedding (each divided by the
image's embedding norm, so they are shares of the cosine with any text) form a matrix X (n, D).
The descriptions' text embeddings T (M, D) are first projected onto the span of X's top
``rank`` right singular vectors (the directions the head can write); X is centred. Then, ``basis``
times: the text whose projections of X vary most over the images is chosen, and X and every
text are projected off its direction. The chosen texts, in order, describe the head; the share
of X's variance their directions remove says how much of the head they explain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.result import Result
from ..hooks import TokenLayout
from ..hooks.inputs import check_count
from ..hooks.selector import select_layers
from ..targets import encode_texts
from .decomposition import EmbeddingDecomposition, embedding_decomposition, image_bytes

__all__ = ["SpannedTexts", "TextSpan", "decompose_images", "span_texts", "text_span"]

MAX_BYTES = 512 * 2**20  # what one batch's decomposition may hold


@dataclass
class SpannedTexts:
    """What `span_texts` chose: ``indices`` (m,) of the texts in order, ``explained`` (m,) the
    share of the centred data's variance removed after each, ``reconstruction`` (n, D) the
    data's mean plus its projections on the chosen directions."""

    indices: list[int]
    explained: list[float]
    reconstruction: Tensor


def span_texts(
    data: Tensor, texts: Tensor, basis: int = 5, rank: int | None = None
) -> SpannedTexts:
    """TextSpan's greedy basis (Alg. 1) of ``data`` (n, D) from the rows of ``texts`` (M, D).

    Args:
        basis: texts to choose (at most M; fewer where the chosen ones already span every
            direction the texts have in the data's span).
        rank: the top right singular vectors of ``data`` the texts are projected onto first;
            None: all of them (min(n, D)).
    """
    data, texts = data.double(), texts.double().to(data.device)
    if data.ndim != 2 or texts.ndim != 2 or data.shape[1] != texts.shape[1]:
        raise ValueError(
            f"data (n, D) and texts (M, D) must share D; got {tuple(data.shape)} and "
            f"{tuple(texts.shape)}."
        )
    basis = check_count("basis", basis, 1, len(texts))
    _, _, vh = torch.linalg.svd(data, full_matrices=False)
    span = vh[: len(vh) if rank is None else check_count("rank", rank, 1, len(vh))]
    texts = texts @ span.T @ span  # onto the directions the data takes (span's rows orthonormal)
    mean = data.mean(0, keepdim=True)
    residual = data - mean
    total = max(float(residual.pow(2).sum()), 1e-300)
    reconstruction = mean.expand_as(data).clone()
    chosen, explained = [], []
    smallest = 1e-20 * float(texts.pow(2).sum(1).max())  # a text's squared norm that is no text
    for _ in range(basis):
        spread = (residual @ texts.T).std(0)
        best = int(spread.argmax())
        direction = texts[best]
        norm = direction @ direction
        if not float(norm) > smallest:
            break  # the chosen texts span every direction the texts had in the data's span
        along = (residual @ direction / norm)[:, None] * direction
        reconstruction += along
        residual = residual - along
        texts = texts - (texts @ direction / norm)[:, None] * direction
        chosen.append(best)
        explained.append(1 - float(residual.pow(2).sum()) / total)
    return SpannedTexts(chosen, explained, reconstruction.float())


@dataclass(repr=False)
class TextSpan(Result):
    """Each head of ``blocks`` described by texts.

    Attributes:
        descriptions: the pool of texts (M).
        blocks: the described blocks (L'); heads: heads per block.
        indices: (L', H, m) the chosen descriptions per head, in order (-1 where a head's basis
            ended early).
        explained: (L', H, m) the share of the head's variance over the images explained after
            each text.
        variance: (L', H) each head's variance over the images (of its share of the cosine).
        decomposition: the images' `EmbeddingDecomposition` (heads, parts, embeddings).
    """

    descriptions: list[str]
    blocks: list[str]
    heads: int
    indices: Tensor
    explained: Tensor
    variance: Tensor
    decomposition: EmbeddingDecomposition
    text_embeddings: Tensor
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def texts(self, block: str | int, head: int) -> list[str]:
        """The texts that describe ``head`` of ``block`` (a path or an index into ``blocks``)."""
        b = self._block(block)
        return [self.descriptions[i] for i in self.indices[b, head].tolist() if i >= 0]

    def table(self) -> list[dict]:
        """One row per head: block, head, its texts, the variance they explain, the head's
        variance."""
        rows = []
        for b, block in enumerate(self.blocks):
            for h in range(self.heads):
                kept = int((self.indices[b, h] >= 0).sum())
                rows.append({
                    "block": block, "head": h, "texts": self.texts(b, h),
                    "explained": float(self.explained[b, h, kept - 1]) if kept else 0.0,
                    "variance": float(self.variance[b, h]),
                })  # fmt: skip
        return rows

    def top_images(self, block: str | int, head: int, text: int = 0, count: int = 8) -> Tensor:
        """(count,) indices of the images whose ``head`` writes most along its ``text``-th
        chosen description (largest share of the cosine with it)."""
        b = self._block(block)
        index = int(self.indices[b, head, text])
        if index < 0:
            raise ValueError(f"Head {head} of {self.blocks[b]} has fewer than {text + 1} texts.")
        full = self.decomposition.blocks.index(self.blocks[b])
        direction = F.normalize(self.text_embeddings[index], dim=-1)
        shares = self.decomposition.head_shares()[:, full, head] @ direction
        return shares.argsort(descending=True)[: check_count("count", count)]

    def _block(self, block: str | int) -> int:
        if isinstance(block, int):
            return range(len(self.blocks))[block]
        if block not in self.blocks:
            raise ValueError(f"{block!r} is not a described block; these are: {self.blocks}.")
        return self.blocks.index(block)


def decompose_images(
    model: nn.Module, images: Tensor, batch_size: int = 64, tokens=None, progress: bool = True,
    max_bytes: int = MAX_BYTES,
) -> EmbeddingDecomposition:  # fmt: skip
    """`embedding_decomposition` of ``images`` (n, C, H, W), concatenated: the result holds
    (n, L, H, D) heads (and (n, T, H, N, D) tokens where ``tokens`` names blocks).

    The first image is decomposed alone; the rest in batches of as many images as
    ``max_bytes`` holds by what that image's decomposition held (`image_bytes`: all of
    ViT-B/16's maps for SigLIP, a class token's rows for CLIP), at most ``batch_size``."""
    batch_size = check_count("batch_size", batch_size)
    max_bytes = check_count("max_bytes", max_bytes)
    with tqdm(total=len(images), disable=not progress, desc="decomposing", leave=False) as bar:
        pieces = [embedding_decomposition(model, images[:1], tokens=tokens)]
        bar.update(1)
        batch = max(1, min(batch_size, max_bytes // image_bytes(pieces[0])))
        for start in range(1, len(images), batch):
            pieces.append(embedding_decomposition(
                model, images[start : start + batch], tokens=tokens))  # fmt: skip
            bar.update(len(pieces[-1].embedding))
    first = pieces[0]
    joined = {name: torch.cat([getattr(p, name) for p in pieces])
              for name in ("contributions", "constant", "embedding", "heads")}  # fmt: skip
    if first.tokens is not None:
        joined["tokens"] = torch.cat([p.tokens for p in pieces])
    return EmbeddingDecomposition(
        first.parts, blocks=first.blocks, token_blocks=first.token_blocks, notes=first.notes,
        options=first.options, layout=first.layout, image_size=first.image_size, **joined,
    )  # fmt: skip


def text_span(
    model: nn.Module, images: Tensor | EmbeddingDecomposition, descriptions: Sequence[str],
    tokenizer=None, layers=None, basis: int = 5, rank: int | None = None,
    batch_size: int = 64, progress: bool = True,
) -> TextSpan:  # fmt: skip
    """TextSpan on a CLIP-family ``model``: each head of ``layers`` described by ``basis`` of
    the ``descriptions``, from its direct contributions over ``images``.

    Args:
        images: (n, C, H, W) images, preprocessed for the model, or their decomposition
            (`decompose_images`).
        descriptions: the pool of texts (the paper's: about 3,500 general image descriptions).
        tokenizer: as `vizkit.targets.text` takes it.
        layers: the blocks to describe (``layers=`` vocabulary); None: all.
        rank: the head's directions the texts are projected onto; None: the head width
            (stream width / heads), or fewer where the images or the embedding have fewer.
    """
    descriptions = [descriptions] if isinstance(descriptions, str) else list(descriptions)
    if len(descriptions) < 2 or not all(isinstance(d, str) and d.strip() for d in descriptions):
        raise ValueError(
            "descriptions must be at least two non-empty texts (the pool each head's basis is "
            f"chosen from); got {descriptions!r}."
        )
    basis = check_count("basis", basis, 1, len(descriptions))
    count = len(images.embedding if isinstance(images, EmbeddingDecomposition) else images)
    if count < 2:
        raise ValueError(
            f"text_span needs at least two images: it describes how each head's contribution "
            f"varies over them (over {count} it has no variance to explain)."
        )
    # the text tower and tokenizer before the images' decomposition, so that a model without
    # them is refused before the long part
    text_embeddings = encode_texts(model, descriptions, tokenizer)
    decomposition = images
    if not isinstance(images, EmbeddingDecomposition):
        decomposition = decompose_images(model, images, batch_size, progress=progress)
    shares = decomposition.head_shares()  # (n, L, H, D)
    blocks = decomposition.blocks if layers is None else select_layers(
        layers, decomposition.blocks, what="blocks")  # fmt: skip
    heads = decomposition.heads.shape[2]
    if rank is None:  # a head writes at most its width's directions
        width = decomposition.options.get("width", heads * decomposition.embedding.shape[-1])
        rank = min(width // heads, len(decomposition.heads), decomposition.heads.shape[-1])
    indices = torch.full((len(blocks), heads, basis), -1)
    explained = torch.zeros(len(blocks), heads, basis)
    variance = torch.zeros(len(blocks), heads)
    for b, block in enumerate(blocks):
        for h in range(heads):
            data = shares[:, decomposition.blocks.index(block), h]
            found = span_texts(data, text_embeddings, basis, rank)
            indices[b, h, : len(found.indices)] = torch.tensor(found.indices, dtype=torch.long)
            explained[b, h, : len(found.explained)] = torch.tensor(found.explained)
            variance[b, h] = (data - data.mean(0)).pow(2).sum(1).mean()
    return TextSpan(
        descriptions, blocks, heads, indices, explained, variance, decomposition,
        text_embeddings, options={"basis": basis, "rank": rank, "layers": blocks},
        layout=decomposition.layout, image_size=decomposition.image_size,
    )  # fmt: skip
