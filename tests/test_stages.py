"""Defaults on hierarchical models: `attention` and `token_norms` of a model whose layers hold
different tokens give one result per token layout (`Stages`), from one forward; explicit layers
must still share their tokens; the statistics figure draws every stage."""

from __future__ import annotations

import json

import pytest
import timm
import torch

import vizkit as vk
from vizkit.analysis import Stages
from vizkit.analysis.result import Result


def swin():
    torch.manual_seed(0)
    model = timm.create_model(
        "swin_tiny_patch4_window7_224", img_size=112, depths=(2, 2, 2, 2), embed_dim=32,
        num_heads=(1, 2, 2, 4),
    ).eval()  # fmt: skip
    return model, torch.randn(2, 3, 112, 112, generator=torch.Generator().manual_seed(1))


def test_swin_default_attention_gives_every_stage_from_one_forward():
    model, x = swin()
    forwards = []
    handle = model.register_forward_pre_hook(lambda m, a: forwards.append(1))
    result = vk.attention(model, x)
    handle.remove()
    assert isinstance(result, Stages) and len(forwards) == 1
    assert result.layers == list(range(8))
    hm = vk.HookedModel(model)
    for stage, grid, heads in zip(result, [28, 14, 7, 4], [1, 2, 2, 4], strict=True):
        assert stage.layout == hm.token_layout((112, 112), stage.names[0])
        assert stage.layout.grid == (grid, grid)
        assert stage.patterns.shape == (2, 2, heads, grid * grid, grid * grid)
        torch.testing.assert_close(stage.patterns.sum(-1), torch.ones(2, 2, heads, grid * grid))
    for stage in result:  # each stage equals the same layers asked for explicitly
        alone = vk.attention(model, x, layers=stage.layers)
        torch.testing.assert_close(alone.patterns, stage.patterns)
    stats = result.stats()
    assert [s["entropy"].shape for s in stats] == [(2, 2, h) for h in (1, 2, 2, 4)]
    assert result.stage_of(5) == 2


def test_stages_round_trip_and_explicit_mixed_layers_are_refused():
    model, x = swin()
    result = vk.attention(model, x)
    back = Result.from_dict(json.loads(json.dumps(result.to_dict())))
    assert isinstance(back, Stages) and back.names == result.names
    assert torch.equal(back[-1].patterns, result[-1].patterns)
    with pytest.raises(ValueError, match="hold different tokens"):
        vk.attention(model, x, layers=[0, 7])
    with pytest.raises(ValueError, match="hold different tokens"):
        vk.attention(model, x, query=(0, 0))
    with pytest.raises(ValueError, match="max_bytes"):
        vk.attention(model, x, max_bytes=2**20)


def test_the_statistics_figure_draws_every_stage_and_single_grid_figures_ask_for_one():
    model, x = swin()
    result = vk.attention(model, x)
    fig = vk.viz.attention_stats_figure(result)
    means = [t for t in fig.data if t.name == "mean"]
    assert all(list(t.x) == [str(i) for i in range(8)] for t in means)
    assert len(fig.layout.shapes) == 3 * len(means)  # a dotted line between 4 stages, per panel
    assert "28x28, 14x14, 7x7, 4x4" in fig.layout.title.text
    with pytest.raises(TypeError, match=r"result\[-1\]"):
        vk.viz.attention_grid(result)
    assert vk.viz.attention_grid(result[-1]).data


def test_token_norms_default_gives_every_stage():
    model, x = swin()
    norms = vk.token_norms(model, x)
    assert isinstance(norms, Stages)
    assert [tuple(s.patches.shape) for s in norms] == [(2, 2, g, g) for g in (28, 14, 7, 4)]
    direct = vk.HookedModel(model).run_with_cache(x, names=norms[1].layers[0])[1]
    expected = direct[norms[1].layers[0]].norm(dim=-1).reshape(2, 14, 14)
    torch.testing.assert_close(norms[1].patches[:, 0], expected)
    with pytest.raises(ValueError, match="hold different tokens"):
        vk.token_norms(model, x, layers=[0, 7])


def test_a_class_token_that_joins_late_gives_two_stages():
    torch.manual_seed(0)
    model = timm.create_model(
        "convit_tiny", img_size=64, depth=3, local_up_to_layer=2, embed_dim=48, num_heads=4
    ).eval()
    result = vk.attention(model, torch.randn(2, 3, 64, 64))
    assert [s.layout.num_prefix_tokens for s in result] == [0, 1]
    assert [s.layers for s in result] == [[0, 1], [2]]


def test_a_plain_vit_still_gives_one_result():
    model = timm.create_model("test_vit").eval()
    result = vk.attention(model, torch.randn(2, 3, 64, 64))
    assert isinstance(result, vk.AttentionResult)
