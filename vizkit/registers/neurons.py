"""Register neurons over a data set (Jiang et al. 2025, "Vision Transformers Don't Need Trained
Registers", Sec. 3.2): the MLP neurons whose activations are high exactly at the high-norm
outlier patches and near zero elsewhere.

Per image: the outlier patches are those whose norm at the detection block's output exceeds
``threshold`` (the paper's cut: 150 at the second-to-last block of DINOv2-L/14, 30 at the last
of OpenCLIP B/16), or by default ``factor`` times the image's median patch norm (the same rule
as `TokenNorms.high_norm`); images without one are skipped. Neuron j of block l scores the mean
of |activation| over the outlier patches, times (with ``sparsity``) whether it is below 0.5 on
at least half of all tokens. Scores are averaged over the images with outliers and ranked over
all candidate blocks together; the top ``top_k`` are the register neurons.

Departure from the reference code: outliers are patches only; the reference also counts the
class token when its norm passes the cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.result import Result
from ..analysis.token_norms import check_norm_cut, high_norm_patches
from ..datasets.labelled import labelled_batches
from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count, check_images, refuse_video_model
from ..hooks.selector import select_layer
from .sites import RegisterSites, register_sites

__all__ = ["RegisterNeurons", "register_neurons"]

SPARSE_BELOW = 0.5  # a sparse neuron's activation is below this ...
SPARSE_SHARE = 0.5  # ... on at least this share of the tokens (the reference's filter)


@dataclass(repr=False)
class RegisterNeurons(Result):
    """The register neurons of a model, and the evidence.

    Attributes:
        neurons: (block path, neuron index) of the chosen neurons, best first (K).
        neuron_scores: (K,) their scores.
        blocks: the candidate blocks (L); scores: (L, J) each neuron's mean score over the
            images with outliers.
        detect: the block whose output the outliers are found at.
        images: images seen; with_outliers: images with at least one outlier patch;
            outliers: outlier patches per image that has any (mean).
        run: every block of the stream; outlier_norms, other_norms: (len(run),) mean norm of
            the outlier patches and of the other patches at each block's output (where the
            artifacts appear).
    """

    neurons: list[tuple[str, int]]
    neuron_scores: Tensor
    blocks: list[str]
    scores: Tensor
    detect: str
    images: int
    with_outliers: int
    outliers: float
    run: list[str]
    outlier_norms: Tensor
    other_norms: Tensor
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def by_block(self) -> dict[str, list[int]]:
        """Block path -> its chosen neuron indices (what `test_time_register` takes)."""
        chosen: dict[str, list[int]] = {}
        for block, index in self.neurons:
            chosen.setdefault(block, []).append(index)
        return {block: sorted(indices) for block, indices in chosen.items()}


def register_neurons(
    model: nn.Module | HookedModel, data: object, layer=-1, layers=None,
    threshold: float | None = None, factor: float = 4.0, top_k: int = 10,
    sparsity: bool = True, batch_size: int = 32, progress: bool = True,
) -> RegisterNeurons:  # fmt: skip
    """Find the register neurons of ``model`` over ``data``.

    Args:
        data: images (n, C, H, W) preprocessed for the model, a Dataset or DataLoader of
            (images, ...) batches, or "shapes" (the shipped sample).
        layer: the block whose output the outlier patches are found at (``layer=``
            vocabulary; the paper: -2 for DINOv2, -1 for OpenCLIP).
        layers: the candidate blocks (``layers=``); default every block up to ``layer``. The
            paper keeps the blocks before the artifacts appear (DINOv2-L: 0-17, OpenCLIP B/16:
            0-5); ``outlier_norms`` shows where they appear.
        threshold: the norm cut; None: ``factor`` times each image's median patch norm.
        top_k: neurons kept (the paper: 50 for DINOv2-L, 10 for OpenCLIP B/16).
        sparsity: keep only neurons below 0.5 on at least half the tokens (the paper's filter).

    Raises:
        ValueError: no image has an outlier patch (the message gives the largest norm ratio),
            or options out of range; the family errors of `test_time_register`.
    """
    refuse_video_model(model.model if isinstance(model, HookedModel) else model, "register_neurons")
    if isinstance(data, Tensor):
        data = (data,)
    return _find(model, data, layer, layers, threshold, factor, top_k, sparsity, batch_size,
                 progress)  # fmt: skip


@analysis_contract
def _find(
    hm: HookedModel, data, layer, layers, threshold, factor, top_k, sparsity, batch_size, progress
) -> RegisterNeurons:
    top_k, batch_size = check_count("top_k", top_k), check_count("batch_size", batch_size)
    check_norm_cut(threshold, factor)  # before any forward
    batches, count = labelled_batches(data, batch_size, "register_neurons")
    found = None
    with tqdm(total=count, unit="image", disable=not progress, desc="register neurons",
              leave=False) as bar:  # fmt: skip
        for x, _, _ in batches:
            x = check_images(hm.model, x)
            if found is None:
                found = _Tally(hm, register_sites(hm, tuple(x.shape[-2:])), layer, layers, x)
            found.add(x, threshold, factor, sparsity)
            bar.update(len(x))
    if found is None:
        raise ValueError("data holds no images.")
    return found.result(top_k, {"threshold": threshold, "factor": factor, "sparsity": sparsity,
                                "top_k": top_k})  # fmt: skip


def _sparse(hidden: Tensor) -> Tensor:
    """(b, J) whether each neuron is below `SPARSE_BELOW` on at least `SPARSE_SHARE` of the
    tokens of ``hidden`` (b, N, J); counted 32 tokens at a time (a mask of every token and the
    integer copy a sum makes of it would hold 3x the activations' bytes)."""
    below = sum((part < SPARSE_BELOW).sum(1, dtype=torch.int32) for part in hidden.split(32, 1))
    return below >= SPARSE_SHARE * hidden.shape[1]


class _Scored(Exception):
    """Raised by the last candidate block's hook: the rest of the forward scores nothing."""


class _Tally:
    """Scores summed over the images with outliers, and the norms where they appear."""

    def __init__(self, hm: HookedModel, sites: RegisterSites, layer, layers, x: Tensor) -> None:
        self.hm, self.sites, self.image_size = hm, sites, tuple(x.shape[-2:])
        self.detect = select_layer(layer, sites.blocks, what="blocks")
        upto = sites.blocks[: sites.blocks.index(self.detect) + 1]
        self.blocks = upto if layers is None else sites.select(layers)
        width = max(sites.neurons[sites.blocks.index(b)] for b in self.blocks)
        self.scores = torch.zeros(len(self.blocks), width, dtype=torch.float64)
        self.norm_sums = torch.zeros(2, len(sites.blocks), dtype=torch.float64)
        self.norm_counts = torch.zeros(2, dtype=torch.float64)
        self.images = self.with_outliers = self.outliers = 0
        self.largest_ratio = 0.0

    def add(self, x: Tensor, threshold: float | None, factor: float, sparsity: bool) -> None:
        """Score the neurons on the images of ``x`` that have outlier patches."""
        norms = self._norms(x)  # (B, L_run, Np) patch norms at each block output
        detect = norms[:, self.sites.blocks.index(self.detect)]
        median = detect.quantile(0.5, dim=-1, keepdim=True)
        self.largest_ratio = max(self.largest_ratio, float((detect / median).max()))
        outlier = high_norm_patches(detect, threshold, factor)  # (B, Np)
        keep = outlier.any(-1)
        self.images += len(x)
        if not keep.any():
            return
        outlier, norms = outlier[keep], norms[keep]
        self.with_outliers += int(keep.sum())
        self.outliers += int(outlier.sum())
        mask = outlier[:, None].expand_as(norms)
        self.norm_sums[0] += norms.where(mask, 0).sum((0, 2)).double()
        self.norm_sums[1] += norms.where(~mask, 0).sum((0, 2)).double()
        self.norm_counts += torch.tensor([outlier.sum(), (~outlier).sum()], dtype=torch.float64)
        self._score(x[keep], outlier, sparsity)

    def _norms(self, x: Tensor) -> Tensor:
        prefix, norms = self.sites.prefix_tokens, {}

        def record(value: Tensor, *, name: str) -> None:
            norms[name] = value.detach().float().norm(dim=-1)[:, prefix:]

        names = [f"{b}.hook_resid_post" for b in self.sites.blocks]
        with torch.no_grad(), self.hm.hooks(fwd=dict.fromkeys(names, record)):
            self.hm.model(x)
        return torch.stack([norms[n] for n in names], 1).cpu()

    def _score(self, x: Tensor, outlier: Tensor, sparsity: bool) -> None:
        """Add each image's neuron scores: one forward of ``x`` (b, C, H, W) with hooks on the
        candidate blocks' projections, stopped after the last of them (the blocks after it
        change no score); ``outlier`` (b, Np) the outlier patches."""
        image, token = outlier.nonzero(as_tuple=True)  # (n,) each outlier patch
        token = (token + self.sites.prefix_tokens).to(x.device)
        image = image.to(x.device)
        counts = outlier.sum(1, keepdim=True).to(x.device)  # (b, 1)
        rows = [self.sites.blocks.index(block) for block in self.blocks]
        handles, fired = [], []

        def score(row: int, last: bool):
            def hook(module: nn.Module, args: tuple) -> None:
                hidden = args[0].detach()  # (b, N, J)
                at = hidden[image, token].float().abs()  # (n, J): the outlier patches only
                mean = torch.zeros(len(hidden), at.shape[-1], device=at.device)
                mean = mean.index_add_(0, image, at) / counts
                if sparsity:
                    mean = mean * _sparse(hidden)
                self.scores[row, : mean.shape[-1]] += mean.sum(0).double().cpu()
                fired.append(row)
                if last:
                    raise _Scored

            return hook

        try:
            for row, site in enumerate(rows):
                linear = self.hm.model.get_submodule(self.sites.linears[site])
                handles.append(linear.register_forward_pre_hook(score(row, site == max(rows))))
            with torch.no_grad():
                self.hm.model(x)
        except _Scored:
            pass
        finally:
            for handle in handles:
                handle.remove()
        if sorted(fired) != list(range(len(rows))):
            raise RuntimeError(
                f"The candidate blocks' projections ran {len(fired)} times in one forward, not "
                f"once each ({len(rows)}): the model does not run its blocks as its modules "
                "list them, so their neurons cannot be scored."
            )

    def result(self, top_k: int, options: dict) -> RegisterNeurons:
        if not self.with_outliers:
            raise ValueError(
                f"No patch of the {self.images} images passes the cut at {self.detect} (the "
                f"largest patch norm is {self.largest_ratio:.1f}x its image's median): the model "
                "writes no high-norm artifacts there. Pass a lower threshold= or factor=, another "
                "layer=, or leave the model as it is: it needs no register."
            )
        scores = (self.scores / self.with_outliers).float()
        values, flat = scores.flatten().sort(descending=True)
        width = scores.shape[1]
        chosen = [(self.blocks[int(i) // width], int(i) % width) for i in flat[:top_k]]
        norms = (self.norm_sums / self.norm_counts.clamp(min=1)[:, None]).float()
        return RegisterNeurons(
            chosen, values[:top_k], self.blocks, scores, self.detect, self.images,
            self.with_outliers, self.outliers / self.with_outliers, self.sites.blocks,
            norms[0], norms[1], options={**options, "layer": self.detect},
            layout=self.hm.token_layout(self.image_size), image_size=self.image_size,
        )  # fmt: skip
