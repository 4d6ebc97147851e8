"""AttnLRP (Achtibat et al. 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for
Transformers", ICML): the target logit's relevance propagated to the pixels in one backward pass,
with the paper's rules for softmax attention, the products in it, the norms and the
nonlinearities (`relevance_rules`). The map is the pixels' relevance summed over channels;
signed: positive for evidence for the target, negative against it."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.captum_bridge import captum_result
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import check_images
from ..hooks.scores import explained_classes, target_score
from .registry import saliency_method
from .relevance_rules import ATTENTION_RULES, relevance_rules

__all__ = ["attnlrp", "input_relevance"]


@saliency_method(
    "attnlrp", needs=("gradients",), default=True,
    summary="relevance propagated with attention-aware LRP rules (Achtibat et al. 2024)",
)  # fmt: skip
@analysis_contract(videos=True)
def attnlrp(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None, attention: str = "attnlrp"
) -> SaliencyResult:
    """AttnLRP maps (B, H, W): each pixel's relevance for the target, summed over channels.

    Args:
        target: a class (or B of them, None: the argmax) whose logit is the relevance to
            distribute; a callable target is differentiated as it is (its gradient at the
            output starts the propagation).
        attention: "attnlrp" (the paper's rules through Q, K and V) or "cp" (CP-LRP: the
            attention weights held constant), see `ATTENTION_RULES`.

    The result's ``extras["relevance"]`` is the (B, C, H, W) relevance; its sum per image is
    the target logit less what biases and the softmax rule absorb.
    """
    if attention not in ATTENTION_RULES:
        raise ValueError(f"attention must be one of {sorted(ATTENTION_RULES)}; got {attention!r}.")
    relevance, output = input_relevance(model, x, target, attention)
    result = captum_result(
        relevance, "attnlrp", "sum", explained_classes(output, target), {"attention": attention}
    )
    result.extras["relevance"] = relevance
    return result


def input_relevance(
    model: nn.Module | HookedModel, x: Tensor, target: Target, attention: str = "attnlrp"
) -> tuple[Tensor, object]:
    """The images' relevance (B, C, H, W) under `relevance_rules`, and the model's output."""
    hm = as_hooked(model)
    x = check_images(hm.model, x).detach().requires_grad_(True)
    with frozen_parameters(hm.model), torch.enable_grad():
        with relevance_rules(attention, hm.model):
            output = hm(x)
        (grad,) = torch.autograd.grad(target_score(output, target, len(x)), x)
    return (x * grad).detach(), output
