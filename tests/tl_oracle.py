"""TransformerLens (4.3, its TransformerBridge with the ViT adapter) as the oracle of direct
logit attribution on a transformers ViT classifier, for tests/test_mechanistic.py.

The bridge wraps a copy of the model (it inserts its own modules) on the original weights (no
folding or centering). Its ViT classifier head has no unembedding ``W_U``, which
``ActivationCache.logit_attrs`` reads, so one is set: the classifier's rows scaled by the final
LayerNorm's gain (``apply_ln_to_stack`` centres each part and divides by the cached scale, but
leaves the gain to the direction)."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn


def _bridge(model: nn.Module):
    """A TransformerBridge around a copy of the transformers classifier ``model``."""
    from transformer_lens.model_bridge.sources import build_bridge_from_module
    from transformer_lens.utilities.attn_implementation import force_eager_attention

    wrapped = copy.deepcopy(model).eval()
    force_eager_attention(wrapped)
    return build_bridge_from_module(wrapped, type(model).__name__,
                                    hf_config=copy.deepcopy(model.config))  # fmt: skip


def tl_resid_patching(
    model: nn.Module, clean: Tensor, corrupted: Tensor, sites: list[tuple[int, int]]
) -> Tensor:
    """(S, B, K) TransformerLens's logits of the corrupted images with the stream entering
    layer l patched at position p from the clean run, one run per (l, p) of ``sites``."""
    bridge = _bridge(model)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(clean)
        runs = []
        for layer, position in sites:
            name = f"blocks.{layer}.hook_resid_pre"

            def patch(activation, hook, name=name, position=position):
                activation[:, position] = cache[name][:, position]
                return activation

            runs.append(bridge.run_with_hooks(corrupted, fwd_hooks=[(name, patch)]))
    return torch.stack(runs)


def tl_head_ablation(model: nn.Module, x: Tensor, heads: list[tuple[int, int]]) -> Tensor:
    """(S, B, K) TransformerLens's logits with head h of layer l zeroed (its ``hook_z``), one
    run per (l, h) of ``heads``."""
    bridge = _bridge(model)
    runs = []
    with torch.no_grad():
        for layer, head in heads:

            def zero(z, hook, head=head):  # (B, N, H, d)
                z[:, :, head] = 0.0
                return z

            runs.append(bridge.run_with_hooks(x, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)]))
    return torch.stack(runs)


def tl_logit_attribution(model: nn.Module, pixels: Tensor, target: int) -> dict[str, Tensor]:
    """TransformerLens's logits (B, K), parts (B, 1 + 2L) at the class token (embed, then
    each layer's attention and MLP output) and heads (B, L, H, each W_O^h z_h without b_O)."""
    bridge = _bridge(model)
    norm = getattr(model, model.base_model_prefix).layernorm
    bridge.unembed.W_U = (norm.weight[:, None] * model.classifier.weight.T).detach().clone()
    layers, heads = bridge.cfg.n_layers, bridge.cfg.n_heads
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(pixels)
        parts = cache.decompose_resid(pos_slice=0)  # (1 + 2L, B, C)
        by_part = cache.logit_attrs(parts, tokens=target, pos_slice=0)
        by_head = cache.logit_attrs(cache.stack_head_results(pos_slice=0), tokens=target,
                                    pos_slice=0)  # fmt: skip
    return {
        "logits": logits,
        "parts": by_part.T,
        "heads": by_head.T.reshape(len(pixels), layers, heads),
    }
