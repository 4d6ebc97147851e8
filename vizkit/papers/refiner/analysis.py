"""Refiner analyses: the distributed-local-attention identity (Refiner, Zhou et al. 2021, § 3.3) and
the stages of one `RefinerAttention` on a batch."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...analysis.result import Result
from ...hooks import HookedModel, TokenLayout
from ...hooks.contract import analysis_contract, as_hooked
from ...hooks.inputs import check_images
from ...hooks.selector import LayerSpec, select_layer

__all__ = [
    "RefinerStages",
    "attend_local_values",
    "convolve_maps",
    "refined_blocks",
    "refiner_stages",
]


def _check_kernel(kernel: Tensor) -> int:
    if kernel.ndim != 2 or kernel.shape[0] != kernel.shape[1] or kernel.shape[0] % 2 == 0:
        raise ValueError(f"kernel must be (k, k) with k odd; got {tuple(kernel.shape)}.")
    return kernel.shape[0] // 2


def convolve_maps(attn: Tensor, kernel: Tensor, padding: str = "zeros") -> Tensor:
    """A* = A cross-correlated with ``kernel`` over (query, key), same size: (..., N, N) ->
    (..., N, N), A*_ij = sum_ab w_ab A_(i-c+a, j-c+b), c = k // 2 (the refiner's convolution).

    Args:
        padding: "zeros" (the refiner's) or "replicate" (for showing that the identity of
            `attend_local_values` needs zero padding).
    """
    if padding not in ("zeros", "replicate"):
        raise ValueError(f"padding must be 'zeros' or 'replicate'; got {padding!r}.")
    c = _check_kernel(kernel)
    n = attn.shape[-1]
    flat = attn.reshape(-1, 1, n, n)
    if padding == "replicate":
        flat = F.pad(flat, (c, c, c, c), mode="replicate")
    out = F.conv2d(flat, kernel.to(attn)[None, None], padding=c if padding == "zeros" else 0)
    return out.reshape(attn.shape)


def _shift(t: Tensor, offset: int, dim: int) -> Tensor:
    """out[m] = t[m + offset] along ``dim``, zero where m + offset is outside."""
    if offset == 0:
        return t
    n = t.shape[dim]
    out = torch.zeros_like(t)
    if abs(offset) >= n:
        return out
    if offset > 0:
        out.narrow(dim, 0, n - offset).copy_(t.narrow(dim, offset, n - offset))
    else:
        out.narrow(dim, -offset, n + offset).copy_(t.narrow(dim, 0, n + offset))
    return out


def attend_local_values(attn: Tensor, kernel: Tensor, values: Tensor) -> Tensor:
    """The "distributed local attention" reading of ``convolve_maps(attn, kernel) @ values``:
    each kernel row w_a convolves the values along the token axis (a true convolution, zero
    padded), the original A attends over those locally aggregated values, and the k results are
    summed with a shift of a - c along the queries:

        out_i = sum_a [A (w_a * V)]_(i - c + a),  (w_a * V)_m = sum_b w_ab V_(m + c - b).

    Shapes: attn (..., N, N), kernel (k, k), values (..., N, d) -> (..., N, d). Equal to the
    convolved maps times V exactly under zero padding (tests check it to 1e-12 in float64).
    """
    c = _check_kernel(kernel)
    out = torch.zeros(*attn.shape[:-1], values.shape[-1], dtype=values.dtype, device=values.device)
    for a in range(2 * c + 1):
        local = sum(kernel[a, b] * _shift(values, c - b, dim=-2) for b in range(2 * c + 1))
        out = out + _shift(attn @ local, a - c, dim=-2)
    return out


@dataclass(repr=False)
class RefinerStages(Result):
    """One refiner's maps on a batch, stage by stage.

    Attributes:
        maps: ``softmax`` (B, H, N, N), ``expanded`` (B, rH, N, N), ``local`` (B, rH, N, N)
            after the head-wise convolution, ``refined`` (B, H, N, N) applied to the values.
        kernels: the learned k x k kernels (rH, k, k), or (rH, 1, k) and (rH, k, 1) stacked as
            ``weight_row``/``weight_col`` for the rowcol constraint (None then).
        expand: W_A (rH, H), or None where the official mode skips it (r = 1).
        reduce: W_R (H, rH).
        layer: the block index.
        name: the block's attention module (``blocks.{layer}.attn``), whose hooks hold the maps.
        layout, image_size: the block's tokens and (H, W) of the input.
    """

    maps: dict[str, Tensor]
    kernels: Tensor | None
    expand: Tensor | None
    reduce: Tensor
    layer: int
    name: str
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    @property
    def options(self) -> dict:
        return {"layer": f"{self.name}.hook_pattern", "layer_index": self.layer}


_STAGES = {
    "softmax": "hook_pattern",
    "expanded": "refiner.hook_expanded",
    "local": "refiner.hook_local",
    "refined": "hook_pattern_refined",
}


def refined_blocks(model: nn.Module) -> list[int]:
    """Indices of the blocks whose attention has a refiner (sharing models: every second)."""
    blocks = getattr(model, "blocks", ())
    return [i for i, block in enumerate(blocks) if getattr(block.attn, "refiner", None)]


@analysis_contract
def refiner_stages(model: nn.Module | HookedModel, x: Tensor, layer: LayerSpec) -> RefinerStages:
    """Capture the stages of block ``layer``'s refiner for the batch ``x`` (B, C, H, W).

    ``layer``: the block (an int, negative from the end), a module path (``"blocks.3"``) or
    one of the block's hook names (``blocks.3.attn.hook_pattern_refined``).

    Raises:
        ValueError: block ``layer`` has no refiner (the message lists the blocks that do).
    """
    hm = as_hooked(model)
    refined = refined_blocks(hm.model)
    blocks = [n for n in hm.hook_names() if re.fullmatch(r"blocks\.\d+\.attn\.hook_pattern", n)]
    stage_names = [n for n in hm.hook_names() if n.startswith("blocks.") and ".attn." in n]
    chosen = select_layer(layer, blocks, stage_names, what="blocks")
    layer = int(chosen.split(".")[1])
    if layer not in refined:
        raise ValueError(
            f"Block {layer} has no attention refiner; blocks with one: {refined or 'none'} "
            "(a vizkit_refined_vit_* model; sharing models refine in every second block)."
        )
    names = {stage: f"blocks.{layer}.attn.{leaf}" for stage, leaf in _STAGES.items()}
    with torch.no_grad():
        x = check_images(hm.model, x)
        _, cache = hm.run_with_cache(x, names=list(names.values()))
    image_size = tuple(x.shape[-2:])
    refiner = hm.model.blocks[layer].attn.refiner
    kernels = getattr(refiner, "weight", None)
    return RefinerStages(
        maps={stage: cache[name] for stage, name in names.items()},
        kernels=None if kernels is None else kernels.detach()[:, 0].clone(),
        expand=None if refiner.weight_expand is None else refiner.weight_expand.detach().clone(),
        reduce=refiner.weight_reduce.detach().clone(),
        layer=layer,
        name=f"blocks.{layer}.attn",
        layout=hm.token_layout(image_size, chosen),
        image_size=image_size,
    )
