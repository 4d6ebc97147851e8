"""Rollout and gradient-weighted rollout against straightforward per-sample loops."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build, hooks_on

import vizkit as vk


def _loop_rollout(patterns: list[np.ndarray], discard_ratio: float, fusion: str) -> np.ndarray:
    """vit-explain's algorithm for one image: patterns (H, N, N) per layer -> joint (N, N)."""
    n = patterns[0].shape[-1]
    joint = np.eye(n)
    for pattern in patterns:
        fused = getattr(pattern, fusion)(axis=0)
        flat = fused.flatten()
        for index in np.argsort(flat, kind="stable")[: int(flat.size * discard_ratio)]:
            if index != 0:
                flat[index] = 0
        a = (flat.reshape(n, n) + np.eye(n)) / 2
        a = a / a.sum(axis=-1, keepdims=True)
        joint = a @ joint
    return joint


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard_ratio", [0.0, 0.6])
def test_rollout_equals_loop(fusion, discard_ratio):
    model, x = build("deit_distilled")  # class + distillation token
    result = vk.rollout(model, x, heads=fusion, discard_ratio=discard_ratio)
    patterns = vk.attention(model, x).patterns.double().numpy()  # (L, B, H, N, N)
    layout = result.layout
    for b in range(len(x)):
        joint = _loop_rollout(list(patterns[:, b]), discard_ratio, fusion)
        expected = joint[0, layout.num_prefix_tokens :].reshape(layout.grid)
        np.testing.assert_allclose(result.maps[b].numpy(), expected, rtol=1e-4, atol=1e-7)
    assert result.options["heads"] == fusion
    assert hooks_on(model) == []


def test_rollout_without_class_token_averages_patch_queries():
    model, x = build("vit_reg_avg")  # one register token, no class token
    result = vk.rollout(model, x)
    patterns = vk.attention(model, x).patterns.double().numpy()
    prefix = result.layout.num_prefix_tokens
    joint = _loop_rollout(list(patterns[:, 0]), 0.0, "mean")
    # the register token is a prefix token but not a class token: rows of all tokens but it
    expected = joint[prefix:, prefix:].mean(0).reshape(result.layout.grid)
    np.testing.assert_allclose(result.maps[0].numpy(), expected, rtol=1e-4)


def test_cait_rollout_is_refused_then_continued_through_class_attention():
    model, x = build("cait")
    with pytest.raises(ValueError, match="not row-stochastic.*allow_non_stochastic=True"):
        vk.rollout(model, x)
    assert hooks_on(model) == []
    result = vk.rollout(model, x, allow_non_stochastic=True)
    hm = vk.HookedModel(model)
    _, cache = hm.run_with_cache(
        x, names=["blocks.*.attn.hook_pattern_mixed", "blocks_token_only.*.attn.hook_pattern"]
    )
    for b in range(len(x)):
        # one (1 + Np) x (1 + Np) matrix per layer over [class token, patches]
        np_ = result.maps[b].numel()
        total = np.eye(1 + np_)
        for i in range(len(model.blocks)):
            mixed = np.abs(cache[f"blocks.{i}.attn.hook_pattern_mixed"][b].double().numpy())
            mixed = (mixed / mixed.sum(-1, keepdims=True)).mean(0)
            step = np.eye(1 + np_)
            step[1:, 1:] = (mixed + np.eye(np_)) / 2  # the class token is not there yet
            total = step @ total
        for j in range(len(model.blocks_token_only)):
            row = cache[f"blocks_token_only.{j}.attn.hook_pattern"][b, :, 0].double().numpy()
            step = np.eye(1 + np_)
            step[0] = (row.mean(0) + np.eye(1 + np_)[0]) / 2  # only the class token changes
            total = step @ total
        expected = total[0, 1:].reshape(result.maps.shape[-2:])
        np.testing.assert_allclose(result.maps[b].numpy(), expected, rtol=1e-4, atol=1e-8)


def test_grad_rollout_equals_chefer_loop():
    model, x = build("vit")
    target = [1, 3]
    result = vk.grad_rollout(model, x, target=target)
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(len(model.blocks))]
    _, cache = vk.HookedModel(model).run_with_cache(x, names=names, grads=True, target=target)
    prefix = result.layout.num_prefix_tokens
    for b in range(len(x)):
        n = cache[names[0]].shape[-1]
        relevance = np.eye(n)
        for name in names:
            a = cache[name][b].double().numpy()
            g = cache[f"{name}_grad"][b].double().numpy()
            cam = np.clip(g * a, 0, None).mean(0)
            relevance = relevance + cam @ relevance
        expected = relevance[0, prefix:].reshape(result.layout.grid)
        np.testing.assert_allclose(result.maps[b].numpy(), expected, rtol=1e-4, atol=1e-8)
    assert result.targets.tolist() == target


def test_grad_rollout_refuses_cait():
    model, x = build("cait")
    with pytest.raises(ValueError, match="class_attention"):
        vk.grad_rollout(model, x)


def test_rollout_argument_errors():
    model, x = build("vit")
    with pytest.raises(ValueError, match="discard_ratio"):
        vk.rollout(model, x, discard_ratio=1.0)
    with pytest.raises(ValueError, match="heads must be .mean., .max., .min."):
        vk.rollout(model, x, heads="median")
    model, x = build("resnet")
    with pytest.raises(ValueError, match="no self-attention"):
        vk.rollout(model, x)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_maps_are_refused_wherever_they_are(bad):
    # a NaN in a row that does not reach the class row would otherwise pass unseen
    import torch

    from vizkit.analysis.attention_rollout import _fuse, check_row_stochastic

    maps = torch.softmax(torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(0)), -1)
    maps[1, 2, 7, 4] = bad
    with pytest.raises(ValueError, match="holds NaN or Inf values"):
        check_row_stochastic(maps, "blocks.3.attn.hook_pattern")
    with pytest.raises(ValueError, match="holds NaN or Inf values"):  # the |A| heuristic too
        _fuse(maps, "blocks.3.attn.hook_pattern", "mean", allow_non_stochastic=True)


def test_the_row_check_copies_no_map_and_keeps_the_maps_dtype_tolerance():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from vizkit.analysis.attention_rollout import _fuse, check_row_stochastic

    class Outputs(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.sizes += [t.numel() for t in torch.utils._pytree.tree_leaves(out)
                           if isinstance(t, torch.Tensor)]  # fmt: skip
            return out

    maps = torch.softmax(torch.randn(2, 6, 40, 40), -1).double()
    with Outputs() as seen:
        check_row_stochastic(maps, "maps")
    assert max(seen.sizes) < maps.numel()  # the rows' sums, not a copy of the maps
    # rollout checks a bfloat16 map before its float64 cast: rows off by up to 2^-7 (rounding)
    logits = torch.randn(2, 6, 200, 200, generator=torch.Generator().manual_seed(0))
    peaked = torch.softmax(logits * 4, -1).bfloat16()
    assert (peaked.float().sum(-1) - 1).abs().max() > 1e-3
    fused = _fuse(peaked, "maps", "mean", allow_non_stochastic=False)
    assert fused.shape == (2, 200, 200) and fused.dtype == torch.float64


@pytest.mark.parametrize("heads", ["mean", "max", "min", 1, [0, 2]])
def test_fusing_the_heads_makes_no_float64_copy_of_every_head(heads):
    """The float64 running product needs one float64 map per layer, not a float64 copy of the
    (B, H, N, N) maps: heads fused as before (in float64), and the allocator (the profiler's
    memory events, which see a kernel's own copies) never holds a copy of all heads."""
    import torch

    from vizkit.analysis.attention_rollout import _fuse

    maps = torch.softmax(torch.randn(2, 6, 60, 60, generator=torch.Generator().manual_seed(0)), -1)
    fused, peak = _allocator_peak(lambda: _fuse(maps, "maps", heads, allow_non_stochastic=False))
    assert peak < maps.numel() * 8 / 2  # a float64 copy of every head is maps.numel() * 8
    expected = vk.hooks.reduce_heads(maps.double(), heads, head_dim=1)
    assert fused.dtype == torch.float64 and torch.equal(fused, expected)


def _allocator_peak(call):
    """(call(), the most CPU bytes it held allocated at once): benchmarks/live_peak.py's count."""
    import importlib.util
    from pathlib import Path

    file = Path(__file__).resolve().parents[1] / "benchmarks" / "live_peak.py"
    spec = importlib.util.spec_from_file_location("live_peak", file)
    live_peak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(live_peak)
    out = []
    peak = live_peak.allocated_peak(lambda: out.append(call()))
    return out[0], peak
