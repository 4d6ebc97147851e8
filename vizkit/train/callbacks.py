"""Per-epoch trackers: each is called as ``tracker(model, epoch, eval_batch)`` after an epoch (the
model in eval mode, the batch a fixed slice of the test set) and returns values stored in the
training history under that epoch; ``{}`` where it does not apply to the model."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis import normalized_entropy, residual_ratios
from ..analysis.cka_kernels import Kernel, cka_from_hsic, hsic_matrix
from ..analysis.layer_cka import LayerKernels
from ..analysis.representations import default_representation_layers
from ..analysis.residual_norms import layerscale_stats
from ..hooks import HookedModel

__all__ = [
    "TRACKERS",
    "AttentionEntropyTracker",
    "CKAToPreviousTracker",
    "LayerScaleTracker",
    "ResidualRatiosTracker",
]


class AttentionEntropyTracker:
    """Mean normalized attention entropy per layer (1 = uniform, 0 = one key):
    ``{"attention_entropy": {pattern name: value}}``."""

    def __call__(self, model: nn.Module, epoch: int, eval_batch: Tensor) -> dict:
        hm = HookedModel(model)
        names = [n for n in hm.hook_names() if n.endswith("attn.hook_pattern")]
        if not names:
            return {}
        with torch.no_grad():
            _, cache = hm.run_with_cache(eval_batch, names=names)
        entropy = {name: normalized_entropy(p).mean().item() for name, p in cache.items()}
        return {"attention_entropy": entropy}


class ResidualRatiosTracker:
    """CaiT's Fig. 4 quantities per block: ``{"residual_ratios": ResidualRatios.to_dict()}``
    (read back with `vizkit.train.tracked_results`)
    (scaled and unscaled ratios of both branches, stream norms, LayerScale statistics)."""

    def __init__(self, reduction: str = "sample_fro") -> None:
        self.reduction = reduction

    def __call__(self, model: nn.Module, epoch: int, eval_batch: Tensor) -> dict:
        if not _has_prenorm_blocks(model):
            return {}
        return {"residual_ratios": residual_ratios(model, eval_batch, self.reduction).to_dict()}


class LayerScaleTracker:
    """``{"layerscale": {"attn": {mean_abs, min, max}, "mlp": {...}}}``, lists over blocks, for
    models with LayerScale (parameters only, no forward)."""

    def __call__(self, model: nn.Module, epoch: int, eval_batch: Tensor) -> dict:
        if not _has_prenorm_blocks(model):
            return {}
        attn, mlp, present = layerscale_stats(model)
        if not any(present):
            return {}
        as_lists = {k: v.tolist() for k, v in vars(attn).items()}
        return {
            "layerscale": {"attn": as_lists, "mlp": {k: v.tolist() for k, v in vars(mlp).items()}}
        }


class CKAToPreviousTracker:
    """Linear CKA (biased, on the eval batch, tokens flattened) of each block's output with the
    same block's output after the previous epoch: ``{"cka_to_previous": {layer: value}}``, from
    the second epoch on (how much each layer still changes)."""

    def __init__(self) -> None:
        self._previous: dict[str, Kernel] = {}

    def __call__(self, model: nn.Module, epoch: int, eval_batch: Tensor) -> dict:
        hm = HookedModel(model)
        names = default_representation_layers(hm)
        current = dict(zip(names, LayerKernels(hm, names)(eval_batch), strict=True))
        previous, self._previous = self._previous, current
        if not previous:
            return {}
        values = {}
        for name, kernel in current.items():
            if kernel.constant or previous[name].constant:
                values[name] = None  # CKA of a constant representation is undefined
                continue
            hsic = hsic_matrix([previous[name], kernel], unbiased=False)
            values[name] = cka_from_hsic(hsic, [f"{name}@{epoch - 1}", name], split=1).item()
        return {"cka_to_previous": values}


def _has_prenorm_blocks(model: nn.Module) -> bool:
    names = HookedModel(model).hook_names()
    return any(n.endswith(".hook_attn_out") for n in names)


# recipe "track" names -> tracker classes
TRACKERS = {
    "attention_entropy": AttentionEntropyTracker,
    "residual_ratios": ResidualRatiosTracker,
    "layerscale": LayerScaleTracker,
    "cka_to_previous": CKAToPreviousTracker,
}  # paper packages add theirs (vizkit.papers.masks: "masks")
