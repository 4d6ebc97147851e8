"""vizkit.attention and its statistics, against loops and scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import build, hooks_on
from scipy.spatial.distance import jensenshannon

import vizkit as vk
from vizkit.analysis import attention_stats


def test_patterns_are_the_hooked_patterns(attention_model):
    key, model, x = attention_model
    result = vk.attention(model, x)
    _, cache = vk.HookedModel(model).run_with_cache(x, names="blocks.*.attn.hook_pattern")
    torch.testing.assert_close(result.patterns, cache.stack("blocks.*.attn.hook_pattern"))
    assert result.layers == list(range(len(model.blocks)))
    assert result.logits.shape == (2, model.num_classes)
    assert hooks_on(model) == []


def test_query_keeps_one_row(vit_model):
    key, model, x = vit_model
    full = vk.attention(model, x, layers=[0, -1])
    layout = full.layout
    query = "cls" if layout.class_token else (1, 2)
    row = vk.attention(model, x, layers=[0, -1], query=query)
    assert row.patterns.shape[-2] == 1
    torch.testing.assert_close(row.row(query), full.row(query))
    with pytest.raises(ValueError, match="Only query token"):
        row.row((0, 0))


def test_row_reshapes_to_grid():
    model, x = build("vit")
    result = vk.attention(model, x, layers=-1)
    gh, gw = result.layout.grid
    index = result.layout.num_prefix_tokens + 1 * gw + 2
    expected = result.patterns[0, :, :, index, result.layout.num_prefix_tokens :]
    torch.testing.assert_close(result.row((1, 2))[0], expected.reshape(2, -1, gh, gw))
    torch.testing.assert_close(result.row((1, 2), heads="max")[0], expected.amax(1).view(2, gh, gw))


def test_memory_limit_says_how_much_and_how_to_shrink():
    model, x = build("vit")
    with pytest.raises(ValueError, match=r"MiB.*layers=\[...\].*query='cls'"):
        vk.attention(model, x, max_bytes=1000)
    assert hooks_on(model) == []
    vk.attention(model, x, query="cls", max_bytes=100_000)  # one row fits


def test_bad_requests_are_clear():
    model, x = build("resnet")
    with pytest.raises(ValueError, match="no self-attention"):
        vk.attention(model, x)
    model, x = build("vit")
    depth = len(model.blocks)
    with pytest.raises(ValueError, match=f"valid: 0..{depth - 1}"):
        vk.attention(model, x, layers=[depth])
    with pytest.raises(ValueError, match="outside the"):
        vk.attention(model, x, query=(9, 0))
    model, x = build("vit_reg_avg")
    with pytest.raises(ValueError, match="no class token"):
        vk.attention(model, x, query="cls")  # prefix token 0 is a register token... and no cls


def _loop_stats(pattern: np.ndarray, prefix: int, grid: tuple[int, int], patch: int):
    """Per-head statistics of one (H, N, N) pattern, with plain loops."""
    heads, n, _ = pattern.shape
    gh, gw = grid
    out = {k: np.zeros(heads) for k in ("entropy", "kl", "dist", "dist_px", "local", "div")}
    for h in range(heads):
        rows = pattern[h]
        ent = [-sum(p * math.log(p) for p in row if p > 0) for row in rows]
        out["entropy"][h] = np.mean(ent) / math.log(n)
        out["kl"][h] = np.mean([math.log(n) - e for e in ent])
        dists, local = [], []
        for q in range(gh * gw):
            weights = rows[prefix + q, prefix:] / rows[prefix + q, prefix:].sum()
            qr, qc = divmod(q, gw)
            d = local_mass = 0.0
            for k in range(gh * gw):
                kr, kc = divmod(k, gw)
                d += weights[k] * math.hypot(qr - kr, qc - kc)
                local_mass += weights[k] * (abs(qr - kr) <= 1 and abs(qc - kc) <= 1)
            dists.append(d)
            local.append(local_mass)
        out["dist"][h], out["local"][h] = np.mean(dists), np.mean(local)
        out["dist_px"][h] = out["dist"][h] * patch
        others = [o for o in range(heads) if o != h]
        out["div"][h] = np.mean(
            [
                np.mean([jensenshannon(rows[q], pattern[o][q]) ** 2 for q in range(n)])
                for o in others
            ]
        )
    return out


def test_statistics_match_loops_and_scipy():
    model, x = build("deit_distilled")  # 2 prefix tokens
    result = vk.attention(model, x, layers=[0, 1])
    stats = result.stats()  # computed a layer at a time
    names = {
        "entropy": "entropy",
        "kl": "kl_uniform",
        "dist": "distance_patches",
        "dist_px": "distance_pixels",
        "local": "locality",
        "div": "diversity",
    }
    for layer in (0, 1):
        pattern = result.patterns[layer, 1].double().numpy()
        expected = _loop_stats(pattern, 2, result.layout.grid, result.patch_size[0])
        for loop_name, name in names.items():
            np.testing.assert_allclose(
                stats[name][layer, 1].numpy(), expected[loop_name], rtol=1e-4
            )


def test_head_divergence_pairs_match_scipy_over_leading_axes():
    p = torch.rand(2, 2, 3, 4, 5, generator=torch.Generator().manual_seed(0)).softmax(-1)
    p[0, 1, 2, :, :3] = 0  # zeros in a row: 0 log 0 = 0
    p = p / p.sum(-1, keepdim=True)
    divergence = attention_stats.head_divergence(p)  # (B, L, H, H) from (B, L, H, Nq, N)
    assert divergence.shape == (2, 2, 3, 3) and divergence.dtype == torch.float32
    for b, layer, i, j in np.ndindex(2, 2, 3, 3):
        rows = p[b, layer].double().numpy()
        expected = np.mean([jensenshannon(rows[i, q], rows[j, q]) ** 2 for q in range(4)])
        assert abs(float(divergence[b, layer, i, j]) - expected) < 1e-6
    heads_first = attention_stats.head_divergence(p.movedim(2, 0), head_dim=0)
    assert torch.equal(heads_first, divergence)
    assert attention_stats.head_divergence(p[:0]).shape == (0, 2, 3, 3)


def test_statistics_extremes():
    layout = vk.TokenLayout(1, (3, 3))
    n = layout.num_tokens
    uniform = torch.full((1, 2, n, n), 1 / n)
    assert torch.allclose(attention_stats.kl_to_uniform(uniform), torch.zeros(1, 2), atol=1e-6)
    assert torch.allclose(attention_stats.head_diversity(uniform), torch.zeros(1, 2), atol=1e-6)
    self_only = torch.eye(n).expand(1, 2, n, n)
    assert torch.allclose(
        attention_stats.mean_attention_distance(self_only, layout), torch.zeros(1, 2)
    )
    assert torch.allclose(attention_stats.locality_mass(self_only, layout), torch.ones(1, 2))
    one_hot = torch.zeros(1, 2, n, n)
    one_hot[0, 0, :, 0], one_hot[0, 1, :, 1] = 1, 1  # disjoint heads: JS = log 2
    assert torch.allclose(attention_stats.head_diversity(one_hot), torch.full((1, 2), math.log(2)))


def test_reduce_heads_options():
    p = torch.rand(2, 3, 4, 5)
    torch.testing.assert_close(vk.hooks.reduce_heads(p, "min"), p.amin(1))
    torch.testing.assert_close(vk.hooks.reduce_heads(p, 2), p[:, 2])
    torch.testing.assert_close(vk.hooks.reduce_heads(p, -1), p[:, 2])
    torch.testing.assert_close(vk.hooks.reduce_heads(p, [0, 2]), (p[:, 0] + p[:, 2]) / 2)
    with pytest.raises(ValueError, match="heads: head 7 does not exist in a map with 3 heads"):
        vk.hooks.reduce_heads(p, 7)
    with pytest.raises(ValueError, match="heads: head 3 does not exist"):
        vk.hooks.reduce_heads(p, [0, 3])
    with pytest.raises(ValueError, match="'mean', 'max', 'min'"):
        vk.hooks.reduce_heads(p, "median")
