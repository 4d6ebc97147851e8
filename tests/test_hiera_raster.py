"""Hiera and SAM2's Hiera in image space (timm ``hiera``, ``hieradet_sam2``; transformers
``HieraModel``, ``Sam2HieraDetModel``): each map, put on the raster grid as the analyses read it,
times the values rerolled by the library gives the attention's own output rerolled by the
library, and equals the model's own softmax (timm's SDPA inputs, transformers' returned or
eager weights) rerolled by the library."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F

import vizkit as vk
from vizkit.analysis._model import grid_map

transformers = pytest.importorskip("transformers")
from transformers.models.sam2 import modeling_sam2  # noqa: E402


def _images(batch: int = 2, size: int = 64):
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def _timm_hiera(**kwargs):
    torch.manual_seed(0)
    return timm.create_model(
        "hiera_tiny_224", pretrained=False, img_size=64, stages=(2, 2, 2, 2), embed_dim=16,
        num_classes=5, **kwargs,
    ).eval()  # fmt: skip


def _hf_hiera():
    torch.manual_seed(0)
    config = transformers.HieraConfig(
        image_size=[64, 64], embed_dim=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 2],
        num_labels=5,
    )  # fmt: skip
    return transformers.HieraForImageClassification(config).eval()


def _timm_sam2(**kwargs):
    torch.manual_seed(0)
    return timm.create_model(
        "hieradet_small", pretrained=False, stages=(1, 2, 2, 2), global_att_blocks=(4,),
        window_spec=(8, 4, 4, 2), embed_dim=16, num_heads=1, num_classes=5, **kwargs,
    ).eval()  # fmt: skip


def _hf_sam2():
    torch.manual_seed(0)
    config = transformers.Sam2HieraDetConfig(
        hidden_size=8, embed_dim_per_stage=[8, 16, 32, 64], blocks_per_stage=[1, 2, 2, 2],
        num_attention_heads_per_stage=[1, 2, 2, 2], global_attention_blocks=[4],
        window_size_per_stage=[8, 4, 4, 2], image_size=[64, 64], attn_implementation="eager",
    )  # fmt: skip
    return transformers.Sam2HieraDetModel(config).eval()


def _on_grid(hm: vk.HookedModel, name: str, pattern, image_size):
    """(B, H, Nq, Nk) on the raster grids, as the analyses read the map."""
    return grid_map(hm, name, pattern, hm.token_layout(image_size, name))


def _unrolled_dense(weights):
    """(B, H, nW, Nq/nW, Nk/nW) (or a global (B, H, Nq, Nk)) -> (B, H, Nq, Nk) in the model's
    token order: slot s of mask unit w is token s·nW + w (the reshape in the attention)."""
    units = weights if weights.ndim == 5 else weights[:, :, None]
    b, h, windows, nq, nk = units.shape
    dense = units.new_zeros(b, h, nq, windows, nk, windows)
    for w in range(windows):
        dense[:, :, :, w, :, w] = units[:, :, w]
    return dense.reshape(b, h, nq * windows, nk * windows)


def _rerolled(dense, reroll, queries_at: int, keys_at: int):
    """Both axes of an unrolled (B, H, Nq, Nk) map put in raster order by the library's reroll
    (each axis passed through it as the token axis of a feature map)."""
    b, h, nq, nk = dense.shape
    keys = reroll(dense.reshape(b * h * nq, nk, 1), keys_at).reshape(b, h, nq, nk)
    queries = reroll(keys.transpose(2, 3).reshape(b * h * nk, nq, 1), queries_at)
    return queries.reshape(b, h, nk, nq).transpose(2, 3)


def _record(modules, store: dict, key: str, index: int = 0) -> list:
    """Forward pre-hooks keeping each module's positional input ``index`` in ``store``."""
    return [
        m.register_forward_pre_hook(lambda mod, args, i=i: store.__setitem__((key, i), args[index]))
        for i, m in enumerate(modules)
    ]


def _applied(pattern, values, heads: int):
    """(B, Nq, C): each head's image-space map times its values (B, Nk, C)."""
    per_head = values.unflatten(-1, (heads, -1)).transpose(1, 2)  # (B, H, Nk, d)
    return (pattern @ per_head).transpose(1, 2).flatten(2)


def _hiera_steps(model):
    """(reroll, [(name, attention, keys step, queries step)]) of a timm or transformers Hiera."""
    if isinstance(model, timm.models.hiera.Hiera):
        blocks = [
            (f"blocks.{i}.attn", block.attn, max(i - 1, 0), i)
            for i, block in enumerate(model.blocks)
        ]
        return model.reroll, blocks
    encoder = model.hiera.encoder
    blocks = [
        (f"hiera.encoder.stages.{s}.layers.{i}.attn", layer.attn, s - 1 if s and not i else s, s)
        for s, stage in enumerate(encoder.stages)
        for i, layer in enumerate(stage.layers)
    ]
    return encoder.reroll, blocks


@pytest.mark.parametrize(
    "build",
    [
        _timm_hiera,
        lambda: _timm_hiera(q_pool=2),  # the last stage still unrolled: global over unrolled
        lambda: _timm_hiera(mask_unit_attn=(True, False, False, False)),
        _hf_hiera,
    ],
    ids=["timm", "timm-q_pool2", "timm-global-stage2", "transformers"],
)
def test_hiera_maps_times_values_give_the_attention_output(build):
    """Every block: the image-space map times the values (the attention's input through its
    qkv, rerolled by the library) gives the attention's output before ``proj`` (as the model
    computed it, SDPA in timm, rerolled by the library). A wrong permutation of queries, keys,
    mask units or slots fails here."""
    model, x = build(), _images()
    hm = vk.HookedModel(model)
    reroll, blocks = _hiera_steps(model)
    seen: dict = {}
    handles = _record([b[1] for b in blocks], seen, "in")
    handles += _record([b[1].proj for b in blocks], seen, "out")
    try:
        with torch.no_grad():
            _, cache = hm.run_with_cache(x, names="*.attn.hook_pattern")
    finally:
        for handle in handles:
            handle.remove()
    kinds = set()
    for i, (path, attn, keys_at, queries_at) in enumerate(blocks):
        name = f"{path}.hook_pattern"
        kinds.add(hm.tap(name).kind)
        pattern = _on_grid(hm, name, cache[name], x.shape[-2:])
        channels = attn.proj.in_features
        with torch.no_grad():
            values = attn.qkv(seen["in", i])[..., 2 * channels :]  # (B, Nk, C) unrolled
        values = reroll(values, keys_at).flatten(1, 2)
        expected = reroll(seen["out", i], queries_at).flatten(1, 2)
        heads = getattr(attn, "heads", None) or attn.num_heads
        torch.testing.assert_close(_applied(pattern, values, heads), expected, atol=1e-5, rtol=1e-4)
    assert "pooled" in kinds and "window" in kinds


def test_timm_hiera_maps_are_the_sdpa_softmax_on_the_grid(monkeypatch):
    """The softmax of the q, k timm hands to F.scaled_dot_product_attention, placed by the
    attention's token layout and rerolled by timm's ``reroll``, is the map vizkit gives."""
    model, x = _timm_hiera(q_pool=2), _images()
    for block in model.blocks:
        block.attn.fused_attn = True
    hm = vk.HookedModel(model)
    weights, sdpa = [], F.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        weights.append(((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5).softmax(-1))
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names="*.attn.hook_pattern")
    assert len(weights) == len(model.blocks)
    for i, own in enumerate(weights):
        name = f"blocks.{i}.attn.hook_pattern"
        expected = _rerolled(_unrolled_dense(own), model.reroll, i, max(i - 1, 0))
        got = _on_grid(hm, name, cache[name], x.shape[-2:])
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_transformers_hiera_maps_are_its_returned_weights_on_the_grid():
    """``output_attentions=True`` returns each stage's last layer's weights (B, H, nW, Nq, Nk);
    rerolled by the model's ``encoder.reroll`` they are vizkit's maps."""
    model, x = _hf_hiera(), _images()
    hm = vk.HookedModel(model)
    with torch.no_grad():
        own = model(x, output_attentions=True).attentions
        _, cache = hm.run_with_cache(x, names="*.attn.hook_pattern")
    encoder = model.hiera.encoder
    for s, weights in enumerate(own):
        i = len(encoder.stages[s].layers) - 1
        name = f"hiera.encoder.stages.{s}.layers.{i}.attn.hook_pattern"
        expected = _rerolled(_unrolled_dense(weights), encoder.reroll, s, s)
        torch.testing.assert_close(_on_grid(hm, name, cache[name], x.shape[-2:]), expected)


def test_mask_units_are_raster_squares():
    """Stage 1 of a 64 px Hiera: 8 x 8 mask units (Sec. 3) on the 16 x 16 grid; a query's map
    is non-zero exactly on its own unit's square."""
    model, x = _timm_hiera(), _images()
    hm = vk.HookedModel(model)
    name = "blocks.0.attn.hook_pattern"
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=name)
    pattern = _on_grid(hm, name, cache[name], x.shape[-2:])  # (B, H, 256, 256)
    rows, cols = torch.arange(16).repeat_interleave(16), torch.arange(16).repeat(16)
    unit = (rows // 8) * 2 + cols // 8
    assert torch.equal(pattern[0, 0] > 0, unit[:, None] == unit[None, :])
    assert hm.tap(name).geometry().window == (8, 8)


def test_hiera_analyses_on_the_grid_and_refusals():
    """vk.attention gives one stage per grid (the pooling blocks, kind "pooled", left out);
    rollout refuses the pooled maps; unrolled streams still refuse a grid."""
    model, x = _hf_hiera(), _images()
    result = vk.attention(model, x)
    assert [stage.layout.grid for stage in result] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert result[0].patterns.shape == (2, 2, 1, 256, 256)
    torch.testing.assert_close(result[0].patterns.sum(-1), torch.ones(2, 2, 1, 256))
    with pytest.raises(ValueError, match="pooled"):
        vk.rollout(model, x)
    stream = "hiera.encoder.stages.0.layers.0.hook_resid_post"
    with pytest.raises(ValueError, match="unrolled order"):
        vk.HookedModel(model).token_layout((64, 64), stream)


def test_attention_on_timm_hiera():
    model, x = _timm_hiera(), _images()
    grids = [stage.layout.grid for stage in vk.attention(model, x)]
    assert grids == [(16, 16), (8, 8), (4, 4), (2, 2)]


@pytest.mark.parametrize("build", [_timm_sam2, _hf_sam2], ids=["timm", "transformers"])
def test_sam2_maps_times_values_give_the_attention_branch(build):
    """Every block (windows, global, pooled queries): the image-space map times the values of
    the raster map gives the branch the block adds, after ``proj``."""
    model, x = build(), _images()
    hm = vk.HookedModel(model)
    timm_model = isinstance(model, timm.models.hieradet_sam2.HieraDet)
    # the branch a block adds: ls1's input (timm), layer_norm2's less the residual (transformers)
    seen: dict = {}
    handles = _record(model.blocks, seen, "in")
    handles += _record([b.ls1 if timm_model else b.layer_norm2 for b in model.blocks], seen, "mid")
    try:
        with torch.no_grad():
            _, cache = hm.run_with_cache(x, names="*.attn.hook_pattern")
    finally:
        for handle in handles:
            handle.remove()
    kinds = set()
    for i, block in enumerate(model.blocks):
        name = f"blocks.{i}.attn.hook_pattern"
        kinds.add(hm.tap(name).kind)
        pattern = _on_grid(hm, name, cache[name], x.shape[-2:])
        attn, inputs = block.attn, seen["in", i]
        with torch.no_grad():
            norm = block.norm1 if timm_model else block.layer_norm1
            values = attn.qkv(norm(inputs)).flatten(1, 2)[..., 2 * attn.dim_out :]
            heads = attn.num_heads if timm_model else attn.num_attention_heads
            got = attn.proj(_applied(pattern, values, heads))
            branch = seen["mid", i]
            if not timm_model:  # layer_norm2 reads the residual + the branch
                residual = inputs
                if block.dim != block.dim_out:
                    pooled = block.proj(block.layer_norm1(inputs))
                    residual = modeling_sam2.do_pool(pooled, block.query_stride)
                branch = branch - residual
        torch.testing.assert_close(got, branch.flatten(1, 2), atol=1e-5, rtol=1e-4)
    assert kinds == {"window", "self", "pooled"}


def test_transformers_sam2_maps_are_its_eager_weights(monkeypatch):
    """The weights transformers' eager attention computes (and SAM2's attention drops) are
    vizkit's maps as captured, for every block whose queries are not pooled inside windows."""
    model, x = _hf_sam2(), _images()
    hm = vk.HookedModel(model)
    weights, eager = [], modeling_sam2.eager_attention_forward

    def recording(*args, **kwargs):
        out, attn_weights = eager(*args, **kwargs)
        weights.append(attn_weights)
        return out, attn_weights

    monkeypatch.setattr(modeling_sam2, "eager_attention_forward", recording)
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names="*.attn.hook_pattern")
    assert len(weights) == len(model.blocks)
    for i, own in enumerate(weights):
        block = model.blocks[i]
        if block.window_size and block.query_stride:
            continue  # recomputed at the block and put on the grid: checked by the test above
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_pattern"], own)


def test_sam2_attention_stages_and_the_padded_window_refusal():
    model = _timm_sam2()
    result = vk.attention(model, _images())
    assert [stage.layout.grid for stage in result] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    padded = timm.create_model("hieradet_small", pretrained=False).eval()  # 16 x 16 windows
    with pytest.raises(ValueError, match="not a multiple of the 16x16 windows"):
        vk.attention(padded, _images(1))
