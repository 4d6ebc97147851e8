"""CRAFT (Fel, Picard, Béthune, Boissin, Vigouroux, Colin, Cadène and Serre 2023, "CRAFT:
Concept Recursive Activation FacTorization for Explainability", CVPR) on a ViT's token stream:
the concepts of a class found by a non-negative factorization of the activations of crops of
its images, each concept's importance for the class's logit estimated by Sobol total indices,
and each concept's map over the patch grid of an image. The settings are those of the
authors' implementation in Xplique (``xplique/concepts/craft.py``, ``craft_torch.py``).

Crops: each image is cut into square crops of side ``patch_size`` on a grid of stride
int(0.8 patch_size), the remainder at the right and bottom edges dropped (a VALID unfold,
image by image, each image's crops in raster order), and each crop is resized back to the
image's size (bilinear, align_corners=False) and run through the model.

The factorization: CRAFT factorizes activations that are non-negative (those of a ReLU
network), A ~ U W with U, W >= 0. A ViT's token stream is not, so its positive part is
factorized: A+ = max(A, 0) at each patch token of the layer (prefix tokens left out), averaged
over the patch tokens of each crop, A+ (n_crops, C) ~ U (n_crops, R) W (R, C), by
scikit-learn's ``NMF(n_components=R, alpha_W=1e-2)`` (otherwise its defaults: the nndsvda
initialisation, coordinate descent, at most 200 iterations; `NMF_ALPHA_W`), in float32, its
random_state ``seed`` (the initialisation's randomized SVD; Xplique leaves it unseeded);
scikit-learn's warning that the iterations ran out is silenced, ``options["nmf_iterations"]``
records them. W is the concept bank, U the crops' coefficients. The coefficients of a new
image are those of each of its patch tokens: ``NMF.transform`` of their A+ with W fixed (a
non-negative least squares, regularized as the fit, all tokens of the images given solved
together as Xplique does: the solver's stopping rule is over all of them), u (Np, R) per
image. R is at most the rank the crops allow, min(n_crops, C).

The importance: at each patch token an image's stream splits into a = u W + r, the concepts'
part u W and the rest r (the negative part and the factorization's error), which is kept
fixed. A mask m in [0, 1]^R scales the coefficients, the same mask at every patch token:
a(m) = (u * m) W + r, computed as a + (u * (m - 1)) W, so that m = 1 leaves the stream as it
is, bit for bit, and the forward is the model's own; prefix tokens (class, registers) are left
as they are. The rest of the network turns a(m) into the class logit f(m). The masks are
`sobol_designs`: an unscrambled Halton sequence in 2R dimensions, its first R columns A, its
last R columns B, and for each concept i, A with column i taken from B; each concept's total
Sobol index is Jansen's estimator (`jansen_total_indices`) over them, and a concept's
importance is its index averaged over the images.

The score is the class's logit, or on a backbone (which returns embeddings, not logits) a
score on the model's output (a `vizkit.targets` helper such as ``embedding_norm()``, or a
callable), read per image: a per-image score target follows each image's perturbed copies.

Where the layer is a block's input or output and a clean run proves that the blocks after it
and the family's readout compute the model's logits from it (for a score target: its output,
which must then be a tensor; `vizkit.analysis.resume`), the rest of the network is those
blocks alone; elsewhere (an MLP's hidden layer, a family without a readout, an output object)
the whole model runs on copies of the image, the stream edited in a hook. The copies run in
passes of at most ``max_bytes`` (`vizkit.hooks.passes`; by default as much as a forward of
``batch_size`` images holds).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import qmc
from sklearn.decomposition import NMF
from sklearn.exceptions import ConvergenceWarning
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.result import Result
from ..analysis.resume import UNDECIDED, LayerRun, layer_run
from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count, check_images, check_values_finite
from ..hooks.passes import images_per_pass
from ..hooks.scores import (
    call_target,
    is_score_target,
    model_logits,
    output_rows,
    target_indices,
    target_label,
)

__all__ = [
    "NMF_ALPHA_W", "STRIDE_SHARE", "Craft", "concept_maps", "craft", "jansen_total_indices",
    "perturbed_logits", "sobol_designs",
]  # fmt: skip

NMF_ALPHA_W = 1e-2  # the NMF's regularization (Xplique's alpha_W; alpha_H "same", l1_ratio 0)
STRIDE_SHARE = 0.8  # the crops' stride, of their side (Xplique: int(0.8 * patch_size))
VARIANCE_FLOOR = 1e-12  # the smallest variance of f(A) Jansen's estimator divides by


@dataclass(repr=False)
class Craft(Result):
    """The concepts CRAFT found in a layer for a class, and their importance.

    Attributes:
        bank: (R, C) the concept bank W: each concept's direction over the layer's C
            channels, non-negative.
        crop_coefficients: (n_crops, R) U, each crop's coefficient of each concept.
        crops: (n_crops, 3) int64, each crop's image, top and left pixel (its side:
            ``options["patch_size"]``), in the order of ``crop_coefficients``.
        importance: (R,) each concept's total Sobol index for the class's logit (or the
            target's score), averaged over the images.
        image_importance: (B, R) the same for each image.
        order: (R,) the concepts from the most important down.
    """

    bank: Tensor
    crop_coefficients: Tensor
    crops: Tensor
    importance: Tensor
    image_importance: Tensor
    order: Tensor
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def table(self, k: int | None = None) -> list[tuple[int, float]]:
        """(concept, importance) of the ``k`` most important concepts (all: None), the most
        important first."""
        order = self.order.tolist()
        if k is not None:
            order = order[: check_count("k", k)]
        return [(c, float(self.importance[c])) for c in order]

    def best_crops(self, concept: int, k: int = 6) -> Tensor:
        """(k, 3) the image, top and left of the ``k`` crops of highest coefficient of
        ``concept`` (fewer where there are fewer crops), highest first."""
        concept = _concept_index(concept, len(self.bank))
        k = min(check_count("k", k), len(self.crops))
        column = self.crop_coefficients[:, concept]
        return self.crops[column.argsort(descending=True, stable=True)[:k]]

    def crop_images(self, images: Tensor, concept: int, k: int = 6) -> Tensor:
        """(k, C, p, p) the pixels of `best_crops` of ``concept``, cut from ``images`` (the
        images CRAFT was run on, (B, C, H, W))."""
        side = self.options["patch_size"]
        boxes = self.best_crops(concept, k).tolist()
        if len(images) != len(self.image_importance):
            raise ValueError(
                f"These concepts were found on {len(self.image_importance)} images; got "
                f"{len(images)}. Pass the images craft was run on."
            )
        return torch.stack([images[b, :, t : t + side, s : s + side] for b, t, s in boxes])


@analysis_contract
def craft(
    model: nn.Module | HookedModel,
    images: Tensor,
    target: int | Callable[[object], Tensor],
    layer: str,
    *,
    concepts: int = 10,
    patch_size: int | None = None,
    designs: int = 32,
    batch_size: int = 64,
    max_bytes: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> Craft:
    """CRAFT's concepts of the class ``target`` (or of a score) in ``layer``, found on
    ``images``.

    Args:
        images: (B, C, H, W) normalized for the model: images of the class whose concepts
            are sought, as in the paper.
        target: the class index whose logit the concepts' importance is measured on; or a
            score on the model's output (a `vizkit.targets` helper, e.g.
            ``vk.targets.embedding_norm()`` on a backbone, or a callable giving (B,)).
        layer: a hook name whose activation is a token stream (B, N, C), e.g.
            "blocks.2.hook_resid_post" or an MLP's hidden layer "blocks.2.mlp.act.hook_out".
            Not the last block's output of a model whose head reads the class token alone:
            no patch token reaches the logit from there, and every importance is 0.
        concepts: R, the number of concepts (at most min(crops, C)).
        patch_size: the crops' side in pixels, from 2 up to the image's shorter side;
            default half of it.
        designs: the quasi-Monte Carlo points of each of the matrices A and B; each image
            runs designs x (R + 2) perturbed forwards.
        batch_size: crops or images per forward; the perturbed copies' passes hold by
            default as much as a forward of this many images.
        max_bytes: the most one pass of perturbed copies may hold (`vizkit.hooks.passes`).
        seed: the NMF's random_state (its nndsvda initialisation starts from a randomized
            SVD; Xplique leaves it unseeded).
        progress: progress bars over the crops and the perturbed passes.

    Returns:
        `Craft`: the concept bank W (R, C), the crops' coefficients U (n_crops, R) and boxes,
        each concept's importance (R,) and per image (B, R), the concepts in order of
        importance.
    """
    scored = is_score_target(target)
    if not scored and (isinstance(target, bool) or not isinstance(target, numbers.Integral)):
        raise TypeError(
            f"target must be the int index of the class whose concepts are sought, or a score "
            f"on the model's output (a vizkit.targets helper, e.g. vk.targets.embedding_norm() "
            f"on a backbone, or a callable); got {target!r} ({type(target).__name__})."
        )
    concepts = check_count("concepts", concepts)
    designs = check_count("designs", designs, 2)
    batch_size = check_count("batch_size", batch_size)
    seed = check_count("seed", seed, 0)
    x = check_images(model.model, images)
    image_size = (int(x.shape[-2]), int(x.shape[-1]))
    side = min(image_size)
    patch_size = check_count("patch_size", side // 2 if patch_size is None else patch_size, 2,
                             side)  # fmt: skip
    name, layout, width, output = _token_stream(model, layer, x)
    if scored:  # a score per image, or the fix
        call_target(target, output, 0, output_rows(output))
    else:  # (B, K) logits, target in range, or the fix
        target_indices(model_logits(output), target)
    stride = int(STRIDE_SHARE * patch_size)
    boxes = _crop_boxes(len(x), image_size, patch_size, stride)
    if concepts > min(len(boxes), width):
        raise ValueError(
            f"concepts must be at most {min(len(boxes), width)}: the factorization of the "
            f"{len(boxes)} crops ({len(x)} images x {len(boxes) // len(x)} crops of "
            f"{patch_size} px) over the layer's {width} channels has no higher rank; got "
            f"{concepts}. Pass more images, a smaller patch_size or fewer concepts."
        )
    pooled = _crop_activations(model, x, boxes, patch_size, name, layout, batch_size, progress)
    if not bool((pooled > 0).any()):
        raise ValueError(
            f"{name} is negative or zero at every patch token of every crop, so its positive "
            "part, which CRAFT factorizes, holds nothing; choose another layer (a block's "
            "output, <block>.hook_resid_post, or an MLP's hidden layer)."
        )
    reducer = NMF(n_components=concepts, alpha_W=NMF_ALPHA_W, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # recorded: nmf_iterations
        crop_u = reducer.fit_transform(pooled.numpy())
    bank = torch.from_numpy(np.asarray(reducer.components_, dtype=np.float32))
    masks = sobol_designs(concepts, designs)
    per_pass = images_per_pass(model.model, x[:1].expand(batch_size, *x.shape[1:]), max_bytes,
                               False, "craft")  # fmt: skip
    coefficients = _coefficients(model, x, name, layout, bank, batch_size)  # (B, Np, R)
    scores, resumed = _perturbed(
        model, x, coefficients, bank, masks, name, layout, batch_size, per_pass,
        _target_score(target), _whole if scored else model_logits, progress,
    )  # fmt: skip
    image_importance = torch.stack([jansen_total_indices(f, designs) for f in scores]).float()
    importance = image_importance.mean(0)
    return Craft(
        bank, torch.from_numpy(np.asarray(crop_u, dtype=np.float32)), boxes, importance,
        image_importance, importance.argsort(descending=True, stable=True),
        options={"layer": name, "target": target_label(target) if scored else int(target),
                 "concepts": concepts, "patch_size": patch_size, "stride": stride,
                 "designs": designs, "images": len(x), "crops": len(boxes),
                 "alpha_W": NMF_ALPHA_W, "seed": seed, "nmf_iterations": int(reducer.n_iter_),
                 "resumed": resumed, "images_per_pass": per_pass},
        layout=layout, image_size=image_size,
    )  # fmt: skip


@analysis_contract
def concept_maps(
    model: nn.Module | HookedModel, craft_result: Craft, images: Tensor, *, batch_size: int = 64
) -> Tensor:
    """(B, R, gh, gw) float32 each concept's coefficient at each patch token of ``images``
    (B, C, H, W): the positive part of ``craft_result``'s layer at each patch token,
    transformed with its bank W fixed (scikit-learn's ``NMF.transform``, every token of the
    images solved together); the concept attribution maps of CRAFT, on the patch grid."""
    bank = _check_craft(craft_result)
    batch_size = check_count("batch_size", batch_size)
    x = check_images(model.model, images)
    name, layout, _, _ = _token_stream(model, craft_result.options["layer"], x)
    coefficients = _coefficients(model, x, name, layout, bank, batch_size)  # (B, Np, R)
    return layout.to_grid(coefficients.transpose(1, 2).contiguous())


@analysis_contract
def perturbed_logits(
    model: nn.Module | HookedModel,
    craft_result: Craft,
    images: Tensor,
    masks: Tensor,
    *,
    batch_size: int = 64,
    max_bytes: int | None = None,
    progress: bool = False,
) -> Tensor:
    """(B, K, classes) float32 the model's logits on each image of ``images`` with its
    concepts' coefficients scaled by each row of ``masks`` (K, R) at every patch token of
    ``craft_result``'s layer, the rest of the stream kept: a + (u * (m - 1)) W (the module's
    docstring). A row of ones gives the model's logits; a row with 0 at concept c removes c.
    ``batch_size`` and ``max_bytes`` as `craft`'s."""
    bank = _check_craft(craft_result)
    batch_size = check_count("batch_size", batch_size)
    if not isinstance(masks, Tensor) or masks.ndim != 2 or masks.shape[1] != len(bank):
        shape = tuple(masks.shape) if isinstance(masks, Tensor) else type(masks).__name__
        raise ValueError(
            f"masks must be (K, {len(bank)}): a scale for each of the {len(bank)} concepts per "
            f"row; got {shape}."
        )
    if not masks.is_floating_point() or len(masks) == 0:
        raise TypeError(f"masks must be a non-empty floating tensor; got {masks.dtype}.")
    check_values_finite("masks", masks)
    x = check_images(model.model, images)
    name, layout, _, output = _token_stream(model, craft_result.options["layer"], x)
    target_indices(model_logits(output), 0)  # (B, K) logits, or the fix
    per_pass = images_per_pass(model.model, x[:1].expand(batch_size, *x.shape[1:]), max_bytes,
                               False, "perturbed_logits")  # fmt: skip
    coefficients = _coefficients(model, x, name, layout, bank, batch_size)
    logits, _ = _perturbed(model, x, coefficients, bank, masks.float(), name, layout,
                           batch_size, per_pass, _all_logits, model_logits, progress)  # fmt: skip
    return logits


def sobol_designs(concepts: int, designs: int) -> Tensor:
    """(designs x (R + 2), R) float32 the masks of Saltelli's replicated design on an
    unscrambled Halton sequence (scipy's ``qmc.Halton(2 R, scramble=False)``, its first
    ``designs`` points, as Xplique's ``HaltonSequenceRS``): rows A (its first R columns),
    B (its last R), then for each concept i in turn A with column i taken from B."""
    concepts, designs = check_count("concepts", concepts), check_count("designs", designs, 2)
    points = qmc.Halton(d=2 * concepts, scramble=False).random(designs).astype(np.float32)
    a, b = torch.from_numpy(points[:, :concepts]), torch.from_numpy(points[:, concepts:])
    replicated = a.repeat(concepts, 1, 1)  # (R, n, R)
    for i in range(concepts):
        replicated[i, :, i] = b[:, i]
    return torch.cat([a, b, replicated.flatten(0, 1)])


def jansen_total_indices(outputs: Tensor, designs: int) -> Tensor:
    """(R,) float64 Jansen's estimator of each input's total Sobol index from ``outputs``
    (designs x (R + 2),), the function at the rows of `sobol_designs` in order:
    ST_i = sum_j (f(A_j) - f(C^(i)_j))^2 / (2 n Var(f(A))), n = ``designs``, the variance
    unbiased (ddof 1) and at least `VARIANCE_FLOOR`."""
    designs = check_count("designs", designs, 2)
    if not isinstance(outputs, Tensor) or outputs.ndim != 1 or len(outputs) % designs:
        shape = tuple(outputs.shape) if isinstance(outputs, Tensor) else type(outputs).__name__
        raise ValueError(
            f"outputs must be (designs x (R + 2),) for designs={designs}; got {shape}."
        )
    concepts = len(outputs) // designs - 2
    if concepts < 1:
        raise ValueError(f"outputs hold {len(outputs)} values, fewer than 3 x designs={designs}.")
    f = outputs.double()
    a, c = f[:designs], f[2 * designs :].view(concepts, designs)
    variance = a.var(correction=1).clamp_min(VARIANCE_FLOOR)
    return ((a - c) ** 2).sum(1) / (2 * designs * variance)


# -- internals -----------------------------------------------------------------------------


def _concept_index(concept: object, count: int) -> int:
    if isinstance(concept, bool) or not isinstance(concept, numbers.Integral):
        raise TypeError(f"concept must be an int in [0, {count}); got {concept!r}.")
    if not 0 <= concept < count:
        raise ValueError(f"concept must be an int in [0, {count}); got {concept}.")
    return int(concept)


def _check_craft(result: object) -> Tensor:
    """``result``'s concept bank (R, C), refused unless it is a `Craft`."""
    if not isinstance(result, Craft):
        raise TypeError(
            f"craft_result must be the Craft that vk.concepts.craft returned; got "
            f"{type(result).__name__}."
        )
    return result.bank.float()


def _token_stream(
    hm: HookedModel, layer: object, x: Tensor
) -> tuple[str, TokenLayout, int, object]:
    """``layer``'s canonical name, token layout on images like x and width C, and the model's
    output on x[:1]; refused unless its activation is a token stream (B, N, C) a hook may
    replace."""
    if not isinstance(layer, str):
        raise TypeError(
            f"layer must be a hook name of a token stream (B, N, C), e.g. "
            f"'blocks.2.hook_resid_post'; got {layer!r} ({type(layer).__name__})."
        )
    tap = hm.tap(layer)  # refuses an unknown name, listing the closest
    layout = hm.token_layout(tuple(x.shape[-2:]), tap.name)
    with torch.no_grad():
        output, cache = hm.run_with_cache(x[:1], [tap.name])
    shape = tuple(cache[tap.name].shape)
    if layout is None or len(shape) != 3 or shape[1] != layout.num_tokens:
        expected = "" if layout is None else f" with {layout.num_tokens} tokens"
        raise ValueError(
            f"{tap.name} is {shape}, not a token stream (B, N, C){expected}: CRAFT factorizes "
            "a block's output (<block>.hook_resid_post), a branch's output or an MLP's hidden "
            "layer (<block>.mlp.act.hook_out)."
        )
    if tap.read.refusal is not None:
        why = tap.read.refusal.format(name=tap.name, module=tap.module)
        raise ValueError(
            f"{tap.name} cannot be edited ({why}), and CRAFT's importance edits it; choose a "
            "block's output or an MLP's hidden layer."
        )
    return tap.name, layout, shape[2], output


def _crop_boxes(count: int, image_size: tuple[int, int], side: int, stride: int) -> Tensor:
    """(count x crops, 3) int64 the image, top and left of each crop: a VALID grid of stride
    ``stride``, image by image, each in raster order (``F.unfold``'s order)."""
    tops = range(0, image_size[0] - side + 1, stride)
    lefts = range(0, image_size[1] - side + 1, stride)
    return torch.tensor([(b, t, s) for b in range(count) for t in tops for s in lefts])


def _crop_activations(
    hm: HookedModel, x: Tensor, boxes: Tensor, side: int, name: str, layout: TokenLayout,
    batch_size: int, progress: bool,
) -> Tensor:  # fmt: skip
    """(n_crops, C) float32 on the CPU: the positive part of ``name`` at each patch token of
    each crop resized to the images' size, averaged over the crop's patch tokens."""
    pooled = []
    size = tuple(x.shape[-2:])
    starts = range(0, len(boxes), batch_size)
    for start in tqdm(starts, desc="craft: crops", unit="batch", disable=not progress,
                      leave=False):  # fmt: skip
        chunk = boxes[start : start + batch_size].tolist()
        crops = torch.stack([x[b, :, t : t + side, s : s + side] for b, t, s in chunk])
        crops = F.interpolate(crops, size=size, mode="bilinear", align_corners=False)
        with torch.no_grad():
            _, cache = hm.run_with_cache(crops, [name])
        patches = layout.split(cache[name], dim=1)[1]  # (b, Np, C)
        pooled.append(patches.float().clamp_min(0).mean(1).cpu())
    return torch.cat(pooled)


def _positive_patches(
    hm: HookedModel, x: Tensor, name: str, layout: TokenLayout, batch_size: int
) -> Tensor:
    """(B, Np, C) float32 on the CPU: the positive part of ``name`` at each patch token."""
    parts = []
    for start in range(0, len(x), batch_size):
        with torch.no_grad():
            _, cache = hm.run_with_cache(x[start : start + batch_size], [name])
        parts.append(layout.split(cache[name], dim=1)[1].float().clamp_min(0).cpu())
    return torch.cat(parts)


def _coefficients(
    hm: HookedModel, x: Tensor, name: str, layout: TokenLayout, bank: Tensor, batch_size: int
) -> Tensor:
    """(B, Np, R) float32 on the CPU: each patch token's concept coefficients, its positive
    part transformed with the bank (R, C) fixed, every token of x solved together."""
    tokens = _positive_patches(hm, x, name, layout, batch_size)  # (B, Np, C)
    if tokens.shape[-1] != bank.shape[1]:
        raise ValueError(
            f"{name} has {tokens.shape[-1]} channels here but the concept bank {bank.shape[1]}; "
            "pass the model (and layer) the concepts were found on."
        )
    coefficients = _transform(tokens.flatten(0, 1).numpy(), bank)
    return torch.from_numpy(coefficients).view(*tokens.shape[:2], len(bank))


def _transform(tokens: np.ndarray, bank: Tensor) -> np.ndarray:
    """(n, R) float32 scikit-learn's ``NMF.transform`` of ``tokens`` (n, C) float32 with
    components ``bank`` (R, C): the NMF CRAFT fits, its fitted state rebuilt from the bank."""
    reducer = NMF(n_components=len(bank), alpha_W=NMF_ALPHA_W)
    reducer.components_ = bank.numpy().astype(np.float32)
    reducer.n_components_ = len(bank)
    reducer.n_features_in_ = bank.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return np.asarray(reducer.transform(tokens.astype(np.float32)), dtype=np.float32)


def _target_score(target: int | Callable[[object], Tensor]) -> Callable[[object, int], Tensor]:
    """(output of copies of image ``b``, b) -> (n,) the class's logit, or the score target's
    value of each copy (a per-image target reads image b's own reference)."""
    if is_score_target(target):
        return lambda output, b: call_target(target, output, b, output_rows(output))
    return lambda output, b: model_logits(output)[:, target]


def _all_logits(output: object, b: int) -> Tensor:
    return model_logits(output)


def _whole(output: object) -> object:
    """What the resumed path must give for a score target: the whole output (the target may
    read any part of it), so only a model whose output is a tensor has a path."""
    return output


def _image_runs(
    hm: HookedModel, x: Tensor, name: str, batch_size: int, proof: Callable[[object], object]
) -> Iterator[tuple[range, LayerRun]]:
    """Each batch of images' indices and clean run at ``name`` (`layer_run`, proving the
    forward from there gives ``proof`` of the output where it can); a batch of one image (or
    of identical ones), which cannot prove it alone, is run beside the first image negated."""
    for start in range(0, len(x), batch_size):
        batch = x[start : start + batch_size]
        run = layer_run(hm, batch, name, proof)
        if run.why == UNDECIDED:
            run = layer_run(hm, torch.cat([batch, -batch[:1]]), name, proof)
        yield range(start, start + len(batch)), run


def _perturbed(
    hm: HookedModel, x: Tensor, coefficients: Tensor, bank: Tensor, masks: Tensor, name: str,
    layout: TokenLayout, batch_size: int, per_pass: int, read: Callable[[object, int], Tensor],
    proof: Callable[[object], object], progress: bool,
) -> tuple[Tensor, bool]:  # fmt: skip
    """(``read`` of the output on copies of each image b of x (``read(output, b)``) with each
    mask (K, R), (B, K, ...) float32 on the CPU; whether every image ran from the layer on,
    where a clean run proved the path gives ``proof`` of the output): the stream's patch
    tokens a replaced by a + (u * (m - 1)) W, u the image's ``coefficients`` (Np, R)."""
    device = x.device
    bank, masks = bank.to(device), masks.to(device)
    prefix, count = layout.num_prefix_tokens, len(masks)
    passes = math.ceil(count / per_pass)
    bar = tqdm(total=len(x) * passes, desc="craft: importance", unit="pass",
               disable=not progress, leave=False)  # fmt: skip
    current: dict[str, Tensor] = {}

    def edit(value: Tensor, *, name: str) -> Tensor:
        edited = value.clone()
        edited[:, prefix:] = (value[:, prefix:].float() + current["delta"]).to(value.dtype)
        return edited

    outputs, every = [], True
    with torch.no_grad(), bar:
        for rows, run in _image_runs(hm, x, name, batch_size, proof):
            every = every and run.resumed is not None
            edited = nullcontext() if run.resumed is not None else hm.hooks(fwd={name: edit})
            with edited:
                for i, b in enumerate(rows):
                    u = coefficients[b].to(device)  # (Np, R)
                    scores = []
                    for start in range(0, count, per_pass):
                        m = masks[start : start + per_pass]
                        delta = (u[None] * (m[:, None, :] - 1)) @ bank  # (k, Np, C)
                        if run.resumed is None:
                            current["delta"] = delta
                            output = hm.model(x[b : b + 1].expand(len(m), *x.shape[1:]))
                        else:
                            streams = run.stream[i : i + 1].expand(len(m), -1, -1).clone()
                            patches = streams[:, prefix:].float() + delta
                            streams[:, prefix:] = patches.to(streams.dtype)
                            output = run.resumed.forward(streams)
                        scores.append(read(output, b).float().cpu())
                        bar.update()
                    outputs.append(torch.cat(scores))
    return torch.stack(outputs), every
