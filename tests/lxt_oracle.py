"""LXT (the AttnLRP authors' package, 2.1) on torchvision's ViT as an oracle, for
tests/test_attnlrp.py and benchmarks/saliency_methods.py: its efficient rules, with its
patches applied to torch's classes for one call and undone after it."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import torch


def _lxt_efficient():
    """LXT's efficient rules and patches, loaded without ``lxt.efficient/__init__`` (which
    imports its LLM patches, written for transformers 4)."""
    import lxt

    if "lxt.efficient" not in sys.modules:
        package = types.ModuleType("lxt.efficient")
        package.__path__ = [str(Path(lxt.__file__).parent / "efficient")]
        sys.modules["lxt.efficient"] = package
    rules = importlib.import_module("lxt.efficient.rules")
    patches = importlib.import_module("lxt.efficient.patches")
    return rules, patches


def lxt_relevance(model, x, targets, attention):
    """(B, C, H, W) input relevance by LXT's patched classes (restored afterwards)."""
    rules, patches = _lxt_efficient()
    nn = torch.nn

    def attnlrp_attention(self, query, key, value, *args, **kwargs):  # LXT's transformers rule
        query, key = rules.divide_gradient(query, 4), rules.divide_gradient(key, 4)
        value = rules.divide_gradient(value, 2)
        return self.original_forward(query, key, value, *args, **kwargs)

    attention_patch = (
        patches.cp_multi_head_attention_forward if attention == "cp" else attnlrp_attention
    )
    saved = {cls: cls.forward for cls in (nn.GELU, nn.LayerNorm, nn.MultiheadAttention)}
    try:
        patches.patch_method(patches.non_linear_forward, nn.GELU, keep_original=True)
        patches.patch_method(patches.layer_norm_forward, nn.LayerNorm)
        patches.patch_method(attention_patch, nn.MultiheadAttention, keep_original=True)
        x = x.clone().requires_grad_(True)
        logits = model(x)
        index = torch.tensor(targets, device=logits.device)[:, None]
        logits.gather(1, index).sum().backward()
        model.zero_grad(set_to_none=True)  # the parameters' gradients of LXT's backward
        return (x * x.grad).detach()
    finally:
        for cls, forward in saved.items():
            cls.forward = forward
            if "original_forward" in cls.__dict__:
                del cls.original_forward
