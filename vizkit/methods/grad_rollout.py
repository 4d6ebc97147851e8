"""Gradient-weighted attention rollout (Chefer, Gur and Wolf, ICCV 2021, "Generic
Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers",
Eq. 5-6)."""

from __future__ import annotations

from torch import Tensor, nn

from ..analysis._model import grid_map
from ..analysis.attention_rollout import class_row_relevance, gradient_rollout_maps, rolled_back
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.inputs import DEFAULT_MAX_BYTES, check_images
from ..hooks.scores import explained_classes
from .registry import saliency_method

__all__ = ["grad_rollout"]


@saliency_method(
    "grad_rollout", needs=("attention", "gradients"),
    summary="gradient-weighted attention rolled out (Chefer et al., ICCV 2021)",
)  # fmt: skip
@analysis_contract(videos=True)
def grad_rollout(
    model: nn.Module | HookedModel,
    x: Tensor,
    target: Target = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> SaliencyResult:
    """Gradient-weighted rollout (Chefer, Gur and Wolf, ICCV 2021, "Generic Attention-model
    Explainability", Eq. 5-6): R = I, then per layer R <- R + mean_h[(dA/dy * A)^+] R; the
    class token's row over the patches. This is their generic method exactly (checked against
    the equations in tests/test_rollout.py); their CVPR 2021 method, with each map's LRP
    relevance in place of A, is `vk.transformer_attribution`.

    Args:
        target: the class to explain: int, B ints, a callable on the logits, or None (argmax).
        max_bytes: refuse, before running, when every layer's map (held by the graph until the
            backward reaches it) and one map's gradient would take more than this (default
            4 GiB).

    Returns:
        `SaliencyResult` (B, gh, gw) with ``targets``: the class token's row of R where the head
            reads the class token, else (average-pooled heads) the mean over the patch rows.
    """
    hm = as_hooked(model)
    names, layout = gradient_rollout_maps(hm, x, max_bytes, "grad_rollout")
    x = check_images(hm.model, x)
    patterns: dict[str, Tensor] = {}
    relevance: Tensor | None = None  # (I + W_L) ... (I + W_k), built from the last layer back
    done: list[str] = []

    def keep(pattern: Tensor, *, name: str) -> None:
        patterns[name] = pattern.detach()

    def multiply(grad: Tensor, *, name: str) -> None:
        """One layer's (dA/dy * A)^+ as the backward reaches it; its gradient is then freed."""
        nonlocal relevance
        if len(done) == len(names) or names[-1 - len(done)] != name:
            raise RuntimeError(f"grad_rollout expected the gradients of {names} last first.")
        done.append(name)
        relevance = rolled_back(relevance, grid_map(hm, name, grad * patterns.pop(name), layout))

    with hm.hooks(fwd={name: keep for name in names}):
        logits, _ = hm.run_with_cache(
            x, names=names[-1], target=target, bwd={name: multiply for name in names}
        )
    if len(done) != len(names):
        raise RuntimeError(f"The target score reached {done} of the attention maps {names}.")
    return SaliencyResult(
        maps=class_row_relevance(hm, relevance, layout),
        method="grad_rollout",
        image_size=tuple(x.shape[-2:]),
        options={"maps": names},
        layout=layout,
        targets=explained_classes(logits, target),
    )
