"""Layer-by-layer CKA within one model or across two, streamed over a data set, and the Refiner
paper's feature-evolution curve (Eq. 2)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract, as_hooked, held
from ..hooks.inputs import check_choice, check_count, check_number, video_input
from ..hooks.layout import feature_map_format, require_per_image
from ..hooks.selector import LayerSpec, layer_indices, select_layers
from ..prefetch import read_ahead
from .cka_kernels import KERNELS, Kernel, check_kernels, kernel
from .minibatch_cka import MinibatchCKA, distributed_world
from .representations import (
    TOKEN_MODES,
    default_representation_layers,
    representation_layers,
    token_features,
)
from .result import Result

__all__ = ["CKAResult", "FeatureEvolution", "LayerKernels", "cka_matrix", "feature_evolution"]

Data = Tensor | Iterable


@dataclass(repr=False)
class CKAResult(Result):
    """Layer x layer CKA.

    Attributes:
        matrix: (La, Lb) float64 on the CPU; ``matrix[i, j]`` = CKA(layers_a[i], layers_b[j]).
        layers_a: hook names of the rows (model a).
        layers_b: hook names of the columns (model b, or model a again).
        indices_a, indices_b: their positions among the model's block outputs
            (`representation_layers`; None for other activations).
        options: kernel, unbiased, tokens, bandwidth, examples, batches, processes, models.
        layout, image_size: model a's tokens and (H, W) of the images.
    """

    matrix: Tensor
    layers_a: list[str]
    layers_b: list[str]
    indices_a: list[int | None]
    indices_b: list[int | None]
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def rows(self) -> list[dict]:
        """One row per layer of model a, one column per layer of model b."""
        return [
            {"layer": a, **dict(zip(self.layers_b, row, strict=True))}
            for a, row in zip(self.layers_a, self.matrix.tolist(), strict=True)
        ]


@dataclass(repr=False)
class FeatureEvolution(Result):
    """The Refiner paper's feature-evolving measure (Eq. 2) over a model's blocks.

    Attributes:
        curve: (L,) F_k = CKA(f_k, f_out) / CKA(f_in, f_out): 1 at the first block, 1/CKA(f_in,
            f_out) at the last.
        vs_first: (L,) CKA(f_k, f_in), the "change w.r.t. the first block" variant of Fig. 4.
        depth: (L,) normalized depth k / L, for comparing models of different depth.
        cka: the full L x L CKAResult the curves are read from.
    """

    curve: Tensor
    vs_first: Tensor
    depth: Tensor
    cka: CKAResult

    @property
    def layers(self) -> list[str]:
        return self.cka.layers_a

    @property
    def options(self) -> dict:
        return self.cka.options

    @property
    def layout(self) -> TokenLayout | None:
        return self.cka.layout

    @property
    def image_size(self) -> tuple[int, int] | None:
        return self.cka.image_size

    def rows(self) -> list[dict]:
        """One row per layer: normalized depth, F_k and CKA to the first layer."""
        return [
            {"layer": name, "depth": d, "feature_evolution": f, "cka_to_first": v}
            for name, d, f, v in zip(
                self.layers, self.depth.tolist(), self.curve.tolist(), self.vs_first.tolist(),
                strict=True,
            )
        ]  # fmt: skip


@analysis_contract(videos=True)
def cka_matrix(
    model: nn.Module | HookedModel,
    data: Data,
    layers: LayerSpec | None = None,
    *,
    model_b: nn.Module | HookedModel | None = None,
    layers_b: LayerSpec | None = None,
    tokens: str = "flatten",
    kernel: str = "linear",
    unbiased: bool = True,
    bandwidth: float = 1.0,
    batch_size: int = 32,
    progress: bool = True,
) -> CKAResult:
    """Minibatch CKA between the layers of one model, or of two models on the same images.

    One forward per batch per model; each layer's activation becomes a kernel on the batch (n x n
    Gram, or n x p features when narrower) inside its hook, so memory does not grow with the
    data. HSIC is averaged over batches and CKA read out at the end (Nguyen et al. 2021). Under
    ``torch.distributed`` (e.g. ``torchrun``) every process passes its own shard of the data and
    the accumulators are summed across processes, so all of them return the full-data matrix.

    Args:
        model: the model of the rows (run in eval mode, as every analysis).
        data: a DataLoader or any iterable of image batches (B, C, H, W) or of tuples whose first
            item is the batch; a map-style Dataset of (image, label, ...) items or one tensor
            (B, C, H, W), either split into batches of ``batch_size``.
        layers: ints counting the blocks' outputs (`representation_layers`, negative from
            the end), module paths (``"blocks.3"``), hook names, globs or a list of these
            (default: every block's output).
        model_b: the model of the columns (default: ``model``, one forward per batch).
        layers_b: its layers (default: its blocks; with ``model_b`` None, ``layers``).
        tokens: how tokens become features: "flatten" (default), "cls", "mean_patches",
            "tokens" (see `token_features`).
        kernel: "linear" or "rbf".
        unbiased: the unbiased HSIC estimator per batch (default, as Nguyen et al.: the
            biased one's bias depends on the batch size); needs >= 4 examples per batch.
        bandwidth: RBF σ as a multiple of the per-batch median distance.
        batch_size: chunk size when ``data`` is one tensor.
        progress: show a progress bar (first process only).

    Returns:
        CKAResult with the (La, Lb) matrix.
    """
    check_choice("tokens", tokens, TOKEN_MODES)
    check_choice("kernel", kernel, KERNELS)
    bandwidth = check_number("bandwidth", bandwidth, 0, low_open=True)
    batch_size = check_count("batch_size", batch_size)
    hm_a = as_hooked(model)
    names_a = _layer_names(hm_a, layers)
    if model_b is None:
        names_b = names_a if layers_b is None else _layer_names(hm_a, layers_b)
        readers = [LayerKernels(hm_a, names_a + names_b, tokens, kernel, bandwidth)]
        keys = readers[0].names
        rows, cols = names_a, names_b
    else:
        hm_b = as_hooked(model_b)
        names_b = _layer_names(hm_b, layers_b)
        readers = [
            LayerKernels(hm_a, names_a, tokens, kernel, bandwidth),
            LayerKernels(hm_b, names_b, tokens, kernel, bandwidth),
        ]
        keys = names_a + [f"model_b:{n}" for n in names_b]
        rows, cols = names_a, keys[len(names_a) :]
    accumulator = MinibatchCKA(keys, unbiased)
    image_size = None
    with held(readers[-1].hm.model):  # model_b too: eval mode, one thread at a time
        for images in _batches(data, batch_size, progress, hm_a.model):
            image_size = tuple(images.shape[-2:])
            kernels: list[Kernel] = []
            for reader in readers:
                kernels += reader(images)
            _check_examples(kernels, keys, tokens)
            if unbiased and kernels[0].n < 4:
                raise ValueError(
                    f"A batch of {kernels[0].n} examples: the unbiased estimator needs >= 4 per "
                    "batch. Use a larger batch size, drop_last=True, or unbiased=False."
                )
            accumulator.update(kernels)
    parameter = next(hm_a.model.parameters(), None)  # where the reduction runs (nccl: the GPU)
    accumulator.all_reduce(parameter.device if parameter is not None else None)
    full = accumulator.cka()
    row, col = [keys.index(n) for n in rows], [keys.index(n) for n in cols]
    options = {
        "kernel": kernel,
        "unbiased": unbiased,
        "tokens": tokens,
        "bandwidth": bandwidth if kernel == "rbf" else None,
        "examples": accumulator.examples,
        "batches": accumulator.batches,
        "processes": distributed_world(),
        "model_a": type(hm_a.model).__name__,
        "model_b": type(readers[-1].hm.model).__name__ if model_b is not None else None,
    }
    hm_b = readers[-1].hm
    return CKAResult(
        full[row][:, col].cpu(),
        names_a,
        names_b,
        layer_indices(names_a, representation_layers(hm_a)),
        layer_indices(names_b, representation_layers(hm_b)),
        options,
        layout=None if image_size is None else hm_a.token_layout(image_size),
        image_size=image_size,
    )


def feature_evolution(
    model: nn.Module | HookedModel,
    data: Data,
    layers: LayerSpec | None = None,
    **options,
) -> FeatureEvolution:
    """The feature-evolving measure of the Refiner paper (Eq. 2, Fig. 2/4) over ``layers``.

    ``f_in`` is the first layer (by default the first block's output, as the paper's Sec. 3.1
    says) and ``f_out`` the last (the last block's output; add ``"hook_final_norm"`` to
    ``layers`` to use the normalized output instead). The paper averages linear CKA over ten
    random batches of 32; here HSIC is averaged over every batch of ``data`` (the minibatch
    estimator), which is less noisy.

    Args:
        model, data, layers: as for `cka_matrix` (at least 2 layers).
        **options: tokens, kernel, unbiased, bandwidth, batch_size, progress of `cka_matrix`.
    """
    result = cka_matrix(model, data, layers, **options)
    depth = len(result.layers_a)
    if depth < 2:
        raise ValueError(
            f"feature_evolution needs at least 2 layers (first and final); got {result.layers_a}."
        )
    to_final, to_first = result.matrix[:, -1], result.matrix[:, 0]
    return FeatureEvolution(
        curve=to_final / to_final[0],
        vs_first=to_first,
        depth=torch.arange(1, depth + 1, dtype=torch.float64) / depth,
        cka=result,
    )


class LayerKernels:
    """Calling it runs one forward of a model on a batch and returns the kernel of each of
    ``names`` on it (in that order); activations are reduced inside their hooks."""

    def __init__(
        self,
        hm: HookedModel,
        names: list[str],
        tokens: str = "flatten",
        kind: str = "linear",
        bandwidth: float = 1.0,
    ) -> None:
        self.hm, self.names = hm, list(dict.fromkeys(names))
        self.tokens, self.kind, self.bandwidth = tokens, kind, bandwidth

    def __call__(self, images: Tensor) -> list[Kernel]:
        kernels: dict[str, Kernel] = {}

        def read(activation: Tensor, *, name: str) -> None:  # images are checked by then
            size = tuple(images.shape[-2:])
            require_per_image(name, activation, len(images))
            prefix = self.hm.tap(name).prefix_tokens
            if prefix is None and activation.ndim == 3:
                layout = self.hm.token_layout(size)
                fits = layout is not None and activation.shape[1] == layout.num_tokens
                prefix = layout.num_prefix_tokens if fits else None  # else: layout unknown
            if activation.ndim == 4 and self.tokens != "flatten":  # positions need (h, w)
                shape = self.hm.tap(name).shape
                if feature_map_format(shape, activation, size) == "NHWC":
                    activation = activation.permute(0, 3, 1, 2)
            class_token = None
            if self.tokens == "cls" and activation.ndim == 3:
                layout = self.hm.token_layout(size, name)
                class_token = layout.class_token if layout is not None else None
            features = token_features(activation, self.tokens, prefix, class_token)
            label = f"layer {name!r} of {type(self.hm.model).__name__}"
            kernels[name] = kernel(features, self.kind, self.bandwidth, name=label, check=False)

        with torch.inference_mode(), self.hm.hooks(fwd=dict.fromkeys(self.names, read)):
            self.hm(images)
        found = [kernels[name] for name in self.names]
        check_kernels(found)  # one host sync for every layer
        return found


def _layer_names(hm: HookedModel, layers: LayerSpec | None) -> list[str]:
    if layers is None:
        return default_representation_layers(hm)
    return select_layers(layers, representation_layers(hm), hm.hook_names(), what="block outputs")


def _batches(data: Data, batch_size: int, progress: bool, model: nn.Module) -> Iterator[Tensor]:
    """``data``'s batches: images (B, C, H, W), or clips (B, T, C, H, W) for a video model."""
    rank, what = (5, "clips (B, T, C, H, W)") if video_input(model) else (4, "images (B, C, H, W)")
    if isinstance(data, Tensor):
        if data.ndim != rank:
            raise ValueError(f"data must be {what}; got {tuple(data.shape)}.")
        data, total = data.split(batch_size), math.ceil(len(data) / batch_size)
    elif isinstance(data, Dataset):  # items (image, label, ...): batch them
        data = DataLoader(data, batch_size=batch_size)
        total = len(data)
    else:
        total = len(data) if hasattr(data, "__len__") else None
    show = progress and (distributed_world() == 1 or torch.distributed.get_rank() == 0)
    first_size = None
    items = read_ahead(data, model, "vizkit-cka-prefetch")  # on a GPU: during this batch
    for item in tqdm(items, total=total, desc="CKA", disable=not show, leave=False):
        images = item[0] if isinstance(item, (list, tuple)) else item
        if not isinstance(images, Tensor) or images.ndim != rank:
            raise TypeError(
                f"Each batch must be a tensor of {what} or a tuple/list whose first item is "
                f"one; got {_describe(images)}. Pass a Dataset, a DataLoader or a tensor."
            )
        first_size = images.shape[1:] if first_size is None else first_size
        if images.shape[1:] != first_size:
            raise ValueError(
                f"A batch of images {tuple(images.shape[1:])} after batches of "
                f"{tuple(first_size)}: "
                "CKA averages one representation over batches, so every image must have the "
                "same size. Resize the data to one size."
            )
        yield images


def _describe(value: object) -> str:
    shape = f" of shape {tuple(value.shape)}" if isinstance(value, Tensor) else ""
    return type(value).__name__ + shape


def _check_examples(kernels: list[Kernel], keys: list[str], tokens: str) -> None:
    counts = {key: k.n for key, k in zip(keys, kernels, strict=True)}
    if len(set(counts.values())) > 1:
        raise ValueError(
            f"The layers give different numbers of examples per batch: {counts}. With "
            f"tokens={tokens!r} every layer (and both models) must have the same number of "
            "tokens; use tokens='flatten' or 'mean_patches', or choose layers of one token count."
        )
