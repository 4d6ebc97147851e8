"""Every timm transformer family vizkit names: maps against independent recomputes from the
block's own weights and against timm's AttentionExtract, hooked output equal to the plain fused
forward, flags restored, hook-name snapshots per family."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from conftest import model_state
from timm.models.eva import apply_rot_embed_cat
from timm.utils import AttentionExtract

import vizkit as vk
from vizkit.hooks.windows import WindowGeometry, window_token_index
from vizkit.models.representatives import FAMILIES

SNAPSHOTS = Path(__file__).parent / "snapshots"

# families with an adapter (named blocks and maps)
ADAPTED = [
    "beit", "eva", "vision_transformer_relpos", "naflexvit", "xcit", "swin_transformer",
    "swin_transformer_v2", "pit", "twins", "crossvit", "maxxvit", "convit", "levit", "mvitv2",
    "hiera", "vision_transformer",
]  # fmt: skip
SOFTMAX_KINDS = ("self", "window", "pooled", "class", "pool", "cross", "channel", "unrolled")


def family(key: str, **overrides):
    """The coverage representative of a timm module (seeded, eval mode, LayerScale widened so
    small branches cannot hide errors) and a batch of 2 images for it."""
    rep = FAMILIES[key]
    torch.manual_seed(0)
    model = timm.create_model(rep.model, **{**rep.kwargs, **overrides}).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("gamma", "gamma_1", "gamma_2")):
                param.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, rep.size, rep.size, generator=torch.Generator().manual_seed(1))
    return model, x


def maps_of(hm: vk.HookedModel) -> list[str]:
    return [n for n in hm.hook_names() if hm.tap(n).kind in SOFTMAX_KINDS]


@pytest.mark.parametrize("key", ADAPTED)
def test_capture_keeps_the_fused_output_and_every_flag(key):
    model, x = family(key)
    before = model_state(model)
    with torch.no_grad():
        plain = model(x)
        out, cache = vk.HookedModel(model).run_with_cache(x, names="*")
    assert (out - plain).abs().max().item() < 1e-4
    assert model_state(model) == before
    assert all(torch.isfinite(v).all() for v in cache.values())


@pytest.mark.parametrize("key", ADAPTED)
def test_softmax_maps_are_row_stochastic(key):
    model, x = family(key)
    hm = vk.HookedModel(model)
    names = maps_of(hm)
    assert names, f"{key} has no named attention maps"
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=names)
    for name in names:
        pattern = cache[name]
        assert pattern.min() >= 0, name
        torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))


@pytest.mark.parametrize("key", ["beit", "eva", "pit", "twins", "crossvit", "maxxvit", "xcit"])
def test_maps_equaltimm_attention_extract(key):
    """timm's own extractor (module hooks on ``attn_drop``, fused attention off) reads the same
    tensors as vizkit's ``attn_drop`` sites."""
    model, x = family(key)
    hm = vk.HookedModel(model)
    names = [n for n in maps_of(hm) if hm.tap(n).module.endswith("attn_drop")]
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=names)
    flags = {m: m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")}
    try:
        for m in flags:
            m.fused_attn = False
        theirs = AttentionExtract(model, names=["*attn_drop"], method="hook")(x)
    finally:
        for m, flag in flags.items():
            m.fused_attn = flag
    assert len(theirs) == len(names)
    for name in names:
        expected = theirs[hm.tap(name).module]
        torch.testing.assert_close(cache[name], expected.reshape(cache[name].shape))


def _qk(attn, x):
    """q, k (B, H, N, d) of a timm attention module with a fused qkv (and q/v biases)."""
    bias = None
    if getattr(attn, "q_bias", None) is not None:
        bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
    elif attn.qkv.bias is not None:
        bias = attn.qkv.bias
    qkv = F.linear(x, attn.qkv.weight, bias).reshape(*x.shape[:2], 3, attn.num_heads, -1)
    q, k, _ = qkv.permute(2, 0, 3, 1, 4)
    return q, k


def test_eva_maps_recomputed_with_rope():
    """EVA (RoPE): softmax over q k^T of the rotated patch tokens, prefix tokens unrotated."""
    model, x = family("eva")
    hm = vk.HookedModel(model)
    with torch.no_grad():
        _, cache = hm.run_with_cache(
            x, names=["blocks.1.attn.hook_pattern", "blocks.1.norm1.hook_out"]
        )
        attn, prefix = model.blocks[1].attn, model.num_prefix_tokens
        q, k = _qk(attn, cache["blocks.1.norm1.hook_out"])
        rope = model.rope.get_embed()
        q = torch.cat([q[:, :, :prefix], apply_rot_embed_cat(q[:, :, prefix:], rope)], 2)
        k = torch.cat([k[:, :, :prefix], apply_rot_embed_cat(k[:, :, prefix:], rope)], 2)
        expected = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], expected)


def test_eva_content_map_is_the_map_without_rope():
    """``attn.hook_content_pattern``: the same logits with unrotated q and k. Without RoPE the
    model's own map equals it; with RoPE the two differ."""
    model, x = family("eva")
    hm = vk.HookedModel(model)
    names = [
        "blocks.1.attn.hook_pattern",
        "blocks.1.attn.hook_content_pattern",
        "blocks.1.norm1.hook_out",
    ]
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=names)
        attn = model.blocks[1].attn
        q, k = _qk(attn, cache["blocks.1.norm1.hook_out"])
        expected = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)
    torch.testing.assert_close(cache["blocks.1.attn.hook_content_pattern"], expected)
    assert (cache["blocks.1.attn.hook_pattern"] - expected).abs().max() > 1e-3
    plain, x = family("eva", use_rot_pos_emb=False)
    assert not any("content" in n for n in vk.HookedModel(plain).hook_names())


@pytest.mark.parametrize("key", ["beit", "vision_transformer_relpos"])
def test_position_bias_separates_content_and_position(key):
    """softmax(q k^T scale + hook_pos_bias) is the captured map: the bias hook holds exactly the
    positional term (BEiT's table, relpos ViT's MLP bias)."""
    model, x = family(key)
    with torch.no_grad():  # BEiT starts its bias tables at zero
        for name, param in model.named_parameters():
            if "relative_position_bias_table" in name:
                param.normal_(0, 1)
    hm = vk.HookedModel(model)
    names = ["blocks.1.attn.hook_pattern", "blocks.1.attn.hook_pos_bias", "blocks.1.norm1.hook_out"]
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=names)
        attn = model.blocks[1].attn
        q, k = _qk(attn, cache["blocks.1.norm1.hook_out"])
        q, k = (
            getattr(attn, "q_norm", torch.nn.Identity())(q),
            getattr(attn, "k_norm", torch.nn.Identity())(k),
        )
        content = (q * attn.scale) @ k.transpose(-2, -1)
        bias = cache["blocks.1.attn.hook_pos_bias"]
    assert bias.shape == (attn.num_heads, *content.shape[-2:])
    assert bias.abs().max() > 0
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], (content + bias).softmax(-1))


def _swin_oracle(block, x_norm, bias=None):
    """Image-space Swin attention of one block from its weights (Liu et al. 2021, Sec. 3.2,
    Eq. 4): token t attends to u iff both fall in the same window of the map cyclically shifted by
    s and in the same region of the shift (the -100 mask); logits q k^T / sqrt(d) + B[dy, dx].
    Swin V2 (Liu et al. 2022, Sec. 3.2): cos(q, k) times the learned temperature, plus ``bias``,
    the captured (H, w², w²) position bias, placed by the tokens' places in their window.

    x_norm: (B, gh, gw, C) attention input. Returns (B, H, Np, Np) in raster order."""
    attn = block.attn
    batch, gh, gw, _ = x_norm.shape
    (wh, ww), (sh, sw) = block.window_size, block.shift_size
    q, k = _qk(attn, x_norm.reshape(batch, gh * gw, -1))
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ((rows - sh) % gh).flatten(), ((cols - sw) % gw).flatten()  # shifted coordinates

    def region(p, g, w, s):  # the three slices timm labels on the shifted map
        return (p >= g - w).long() + (p >= g - s).long() if s else torch.zeros_like(p)

    same = ((ys[:, None] // wh) == (ys[None] // wh)) & ((xs[:, None] // ww) == (xs[None] // ww))
    same &= region(ys, gh, wh, sh)[:, None] == region(ys, gh, wh, sh)[None]
    same &= region(xs, gw, ww, sw)[:, None] == region(xs, gw, ww, sw)[None]
    if bias is None:  # Swin: the table, indexed by the offset
        logits = (q * attn.scale) @ k.transpose(-2, -1)
        table = attn.relative_position_bias_table.view(2 * wh - 1, 2 * ww - 1, -1)
        dy, dx = ys[:, None] - ys[None], xs[:, None] - xs[None]
        placed = table[dy.clamp(-wh + 1, wh - 1) + wh - 1, dx.clamp(-ww + 1, ww - 1) + ww - 1]
        placed = placed.permute(2, 0, 1)
    else:  # Swin V2: scaled cosine attention and the captured continuous bias
        temperature = attn.logit_scale.clamp(max=math.log(100)).exp()
        logits = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1) * temperature
        local = (ys % wh) * ww + xs % ww
        placed = bias[:, local[:, None], local[None]]
    return (logits + placed).masked_fill(~same, float("-inf")).softmax(-1)


@pytest.mark.parametrize("block_index", [0, 1])  # plain and shifted windows
def test_swin_image_space_maps_equal_an_independent_recompute(block_index):
    model, x = family("swin_transformer")
    hm = vk.HookedModel(model)
    block = model.layers[0].blocks[block_index]
    assert any(block.shift_size) == bool(block_index)
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=f"layers.0.blocks.{block_index}.norm1.hook_out")
        result = vk.attention(model, x, layers=block_index)
        expected = _swin_oracle(block, cache[f"layers.0.blocks.{block_index}.norm1.hook_out"])
    assert result.patterns.shape == (1, 2, block.attn.num_heads, 28 * 28, 28 * 28)
    torch.testing.assert_close(result.patterns[0], expected, atol=1e-6, rtol=1e-5)
    assert result.layout.grid == (28, 28) and result.patch_size == (4.0, 4.0)
    stats = result.stats()  # windows bound the distance: at most the window's diagonal
    assert (stats["distance_patches"] <= 6 * 2**0.5).all()


def test_swinv2_image_space_maps_equal_cosine_attention_with_its_bias():
    model, x = family("swin_transformer_v2")
    hm = vk.HookedModel(model)
    block = model.layers[0].blocks[1]
    assert any(block.shift_size)
    names = ["layers.0.blocks.1.hook_resid_pre", "layers.0.blocks.1.attn.hook_pos_bias"]
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=names)
        result = vk.attention(model, x, layers=1)
        gh, gw = result.layout.grid
        stream = cache["layers.0.blocks.1.hook_resid_pre"].view(2, gh, gw, -1)  # post-norm:
        expected = _swin_oracle(block, stream, cache["layers.0.blocks.1.attn.hook_pos_bias"])
    torch.testing.assert_close(result.patterns[0], expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("key", "block"), [
    ("vision_transformer", "blocks.1"),
    ("pit", "transformers.1.blocks.0"),
    ("crossvit", "blocks.0.blocks.1.0"),
    ("naflexvit", "blocks.1"),
])  # fmt: skip
def test_vit_attention_maps_recomputed_from_the_block(key, block):
    """timm's ``Attention`` in ViT, PiT, CrossViT and NaFlexViT blocks: softmax(q k^T / sqrt(d))
    of the block's normed input, q and k through the block's q/k norms."""
    model, x = family(key)
    hm = vk.HookedModel(model)
    with torch.no_grad():
        _, cache = hm.run_with_cache(
            x, names=[f"{block}.attn.hook_pattern", f"{block}.norm1.hook_out"]
        )
        attn = model.get_submodule(f"{block}.attn")
        q, k = _qk(attn, cache[f"{block}.norm1.hook_out"])
        expected = ((attn.q_norm(q) * attn.scale) @ attn.k_norm(k).transpose(-2, -1)).softmax(-1)
    torch.testing.assert_close(cache[f"{block}.attn.hook_pattern"], expected)


def test_xcit_channel_maps_are_cross_covariance_attention():
    """XCiT (El-Nouby et al. 2021, Eq. 3): softmax(k̂^T q̂ τ) over channels, q and k
    l2-normalized over the tokens: (B, H, C/H, C/H), not a token map."""
    model, x = family("xcit")
    hm = vk.HookedModel(model)
    with torch.no_grad():
        _, cache = hm.run_with_cache(
            x, names=["blocks.0.attn.hook_channel_pattern", "blocks.0.norm1.hook_out"]
        )
        attn, tokens = model.blocks[0].attn, cache["blocks.0.norm1.hook_out"]
        b, n, c = tokens.shape
        qkv = attn.qkv(tokens).reshape(b, n, 3, attn.num_heads, c // attn.num_heads)
        q, k, _ = qkv.permute(2, 0, 3, 4, 1)  # (B, H, C/H, N)
        expected = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        expected = (expected * attn.temperature).softmax(-1)
    assert expected.shape[-1] == c // attn.num_heads
    torch.testing.assert_close(cache["blocks.0.attn.hook_channel_pattern"], expected)
    with pytest.raises(ValueError, match="channel"):
        vk.attention(model, x)


def test_window_index_undoes_the_shift():
    """Each grid token sits in exactly one window; a shifted partition is timm's roll by -s."""
    grid, geometry = (8, 12), WindowGeometry((4, 4), (2, 2))
    index = window_token_index(grid, geometry)
    assert sorted(index.flatten().tolist()) == list(range(96))
    raster = torch.arange(96).view(1, 8, 12, 1)
    shifted = torch.roll(raster, shifts=(-2, -2), dims=(1, 2))
    windows = shifted.view(1, 2, 4, 3, 4, 1).permute(0, 1, 3, 2, 4, 5).reshape(6, 16)
    assert torch.equal(index, windows)
    with pytest.raises(ValueError, match="not a multiple of the 4x4 windows"):
        window_token_index((10, 12), geometry)


def test_maxvit_grid_attention_is_dilated():
    """MaxViT's grid attention: window (a, b) holds the tokens (i gh/g + a, j gw/g + b)."""
    model, x = family("maxxvit")
    geometry = vk.HookedModel(model).tap("stages.0.blocks.0.attn_grid.attn.hook_pattern").geometry()
    (g, _), stride = geometry.window, 16 // geometry.window[0]
    assert geometry.dilated
    index = window_token_index((16, 16), geometry)
    assert index[0, :2].tolist() == [0, stride]  # window 0, first row of its tokens
    assert index[0, g].item() == stride * 16 and index[1, 0].item() == 1


def test_swin_gradcam_reads_channels_last_stage_outputs():
    """The bug this family work started from: a (B, h, w, C) stage output read as (B, C, h, w)
    gave maps of shape (B, h, C). Every default and explicit layer now gives (B, h, w), equal to
    Grad-CAM computed by hand on the channels-last tensor."""
    model, x = family("swin_transformer")
    default = vk.gradcam(model, x, target=1)
    assert default.maps.shape == (2, 4, 4)
    stage = vk.gradcam(model, x, target=1, layer="layers.3.hook_out")
    raw = vk.gradcam(model, x, target=1, layer="layers.3.blocks.1.hook_resid_post")
    assert stage.maps.shape == raw.maps.shape == (2, 4, 4)
    feature = {}
    handle = model.layers[3].register_forward_hook(lambda m, i, o: feature.update(a=o))
    try:
        logits = model(x)
        grad = torch.autograd.grad(logits[:, 1].sum(), feature["a"])[0]  # (B, h, w, C)
    finally:
        handle.remove()
    expected = (grad.mean((1, 2), keepdim=True) * feature["a"]).sum(-1).clamp_min(0)
    torch.testing.assert_close(stage.maps, expected.detach())
    torch.testing.assert_close(default.maps, expected.detach())  # the last block's output


def test_attention_pool_map_reproduces_the_head():
    """SigLIP's MAP head: the recomputed (B, H, Lq, N) map times v, projected, plus the head's
    MLP, is the head's output."""
    model, x = family("vision_transformer")
    hm = vk.HookedModel(model)
    pool = model.attn_pool
    with torch.no_grad():
        names = ["attn_pool.hook_pattern", "hook_final_norm", "attn_pool.hook_out"]
        _, cache = hm.run_with_cache(x, names=names)
        tokens = cache["hook_final_norm"]
        b, n, c = tokens.shape
        v = pool.kv(tokens).reshape(b, n, 2, pool.num_heads, -1).permute(2, 0, 3, 1, 4)[1]
        out = (cache["attn_pool.hook_pattern"] @ v).transpose(1, 2).reshape(b, -1, c)
        out = pool.proj(out)
        out = out + pool.mlp(pool.norm(out))
    torch.testing.assert_close(out[:, 0], cache["attn_pool.hook_out"])
    result = vk.class_attention(model, x)
    assert result.options["stage"] == "pooling-head" and result.maps.shape == (2, 4, 4)


@pytest.mark.parametrize(("key", "cls"), [
    ("levit", "Attention"),
    ("levit", "AttentionDownsample"),
    ("mvitv2", "MultiScaleAttention"),
    ("tiny_vit", "Attention"),
    ("efficientformer", "Attention"),
    ("hieradet_sam2", "MultiScaleAttention"),
    ("lowformer", "ConvAttention"),
    ("cpubone", "ConvAttention"),
    ("shvit", "SHSA"),
    ("byoanet", "BottleneckAttn"),
    ("efficientvit_msra", "CascadedGroupAttention"),
])  # fmt: skip
def test_recomputed_maps_reproduce_the_module_output(key, cls):
    """LeViT, MViTv2, TinyViT, EfficientFormer, SAM2's Hiera, LowFormer, CPUBone, SHViT, BoTNet
    and EfficientViT (MSRA) never hand their map to a module; the recomputed map times the
    values must give the attention module's output (Hiera's, in raster order:
    tests/test_hiera_raster.py)."""
    model, x = family(key)
    hm = vk.HookedModel(model)
    name = next(
        n
        for n, m in model.named_modules()
        if type(m).__name__ == cls and f"{n}.hook_pattern" in hm.hook_names()
    )
    attn = model.get_submodule(name)
    seen = {}
    handle = attn.register_forward_hook(lambda m, a, o: seen.update(args=a, out=o))
    try:
        with torch.no_grad():
            _, cache = hm.run_with_cache(x, names=f"{name}.hook_pattern")
            expected = seen["out"][0] if isinstance(seen["out"], tuple) else seen["out"]
            out = _apply_map(key, attn, cache[f"{name}.hook_pattern"], seen["args"])
    finally:
        handle.remove()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def _apply_map(key, attn, pattern, args):
    x = args[0]
    if key == "levit":
        b, n, _ = x.shape
        if hasattr(attn, "kv"):
            v = attn.kv(x).view(b, n, attn.num_heads, -1)[..., attn.key_dim :].transpose(1, 2)
        else:
            v = attn.qkv(x).view(b, n, attn.num_heads, -1)[..., 2 * attn.key_dim :].transpose(1, 2)
        return attn.proj((pattern @ v).transpose(1, 2).reshape(b, -1, attn.val_attn_dim))
    if key == "mvitv2":
        from timm.models.mvitv2 import reshape_post_pool, reshape_pre_pool

        b, n, _ = x.shape
        qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, v = qkv[0], qkv[2]
        pooled = []
        for t, pool, norm in ((q, attn.pool_q, attn.norm_q), (v, attn.pool_v, attn.norm_v)):
            t, tok = reshape_pre_pool(t, args[1], attn.has_cls_token)
            pooled.append(norm(reshape_post_pool(pool(t), attn.num_heads, tok)[0]))
        out = pattern @ pooled[1] + (pooled[0] if attn.residual_pooling else 0)
        return attn.proj(out.transpose(1, 2).reshape(b, -1, attn.dim_out))
    if key in ("tiny_vit", "efficientformer"):
        x = attn.norm(x) if hasattr(attn, "norm") else x
        b, n, _ = x.shape
        v = attn.qkv(x).view(b, n, attn.num_heads, -1)[..., 2 * attn.key_dim :].transpose(1, 2)
        return attn.proj((pattern @ v).transpose(1, 2).reshape(b, n, -1))
    if key in ("lowformer", "cpubone"):
        height, width = x.shape[-2:]
        if getattr(attn, "small_kernels", False) and attn.att_stride > 1:
            s = attn.att_stride
            x = F.pad(x, (0, (-width) % s, 0, (-height) % s))
        projected = attn.pwise(attn.conv_proj(x))
        b, _, h, w = projected.shape
        qkv = projected.reshape(b, attn.num_heads, -1, h * w).permute(0, 1, 3, 2)
        v = qkv.chunk(3, dim=3)[2]
        o = attn.o_proj((pattern @ v).permute(0, 1, 3, 2).reshape(b, attn.o_proj_inpdim, h, w))
        return attn.upsampling(o)[..., :height, :width]
    if key == "shvit":
        x1, x2 = torch.split(x, [attn.pdim, attn.dim - attn.pdim], dim=1)
        v = torch.split(attn.qkv(attn.pre_norm(x1)), [attn.qk_dim, attn.qk_dim, attn.pdim], 1)[2]
        x1 = (v.flatten(2) @ pattern[:, 0].transpose(-2, -1)).reshape(x1.shape)
        return attn.proj(torch.cat([x1, x2], dim=1))
    if key == "efficientvit_msra":  # the cascade again, with the captured maps
        b, _, h, w = x.shape
        groups, feat, outs = x.chunk(len(attn.qkvs), dim=1), None, []
        for head, qkv in enumerate(attn.qkvs):
            feat = groups[0] if head == 0 else feat + groups[head]
            v = qkv(feat).view(b, -1, h, w)[:, 2 * attn.key_dim :].flatten(2)
            feat = (v @ pattern[:, head].transpose(-2, -1)).view(b, attn.val_dim, h, w)
            outs.append(feat)
        return attn.proj(torch.cat(outs, 1))
    if key == "byoanet":
        b, _, h, w = x.shape
        v = torch.split(attn.qkv(x), [attn.dim_out_qk, attn.dim_out_qk, attn.dim_out_v], 1)[2]
        v = v.reshape(b * attn.num_heads, attn.dim_head_v, -1).transpose(-1, -2)
        out = (pattern.flatten(0, 1) @ v).transpose(-1, -2).reshape(b, attn.dim_out_v, h, w)
        return attn.pool(out)
    assert key == "hieradet_sam2", key
    b, h, w, _ = x.shape
    v = attn.qkv(x).reshape(b, h * w, 3, attn.num_heads, -1)[:, :, 2].transpose(1, 2)
    side = int(pattern.shape[-2] ** 0.5)
    return attn.proj((pattern @ v).transpose(1, 2).reshape(b, side, side, -1))


def test_convit_gate_mixes_content_and_position():
    model, x = family("convit")
    hm = vk.HookedModel(model)
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names="blocks.0.attn.hook_*")
    gate = cache["blocks.0.attn.hook_gate"][None, :, None, None]
    mixed = (1 - gate) * cache["blocks.0.attn.hook_content_pattern"]
    mixed = mixed + gate * cache["blocks.0.attn.hook_position_pattern"]
    torch.testing.assert_close(
        mixed / mixed.sum(-1, keepdim=True), cache["blocks.0.attn.hook_pattern"]
    )


def test_hierarchical_models_name_their_stage_grids():
    model, x = family("swin_transformer")
    hm = vk.HookedModel(model)
    grids = [
        hm.token_layout(x.shape[-2:], f"layers.{s}.blocks.0.hook_resid_post").grid for s in range(4)
    ]
    assert grids == [(28, 28), (14, 14), (7, 7), (4, 4)]
    with pytest.raises(ValueError, match=r"layers 0\.\.1: 0 prefix \+ 28x28 patches"):
        vk.attention(model, x, layers=[0, 1, 6, 7])
    assert [stage.layout.grid for stage in vk.attention(model, x)] == grids
    assert vk.analysis.stage_layers(model, x.shape[-2:]) == [6, 7]


def test_swin_rollout_follows_patch_merging():
    """Rollout across Swin's stages: per layer (A + I) / 2 of the head-mean image-space map, and
    between stages each merged token the mean of its 2 x 2 sources, written out with loops."""
    model, x = family("swin_transformer")
    result = vk.rollout(model, x)
    joint, grid = None, None
    for i in range(8):
        layer = vk.attention(model, x, layers=i)
        step = layer.patterns[0].double().mean(1)
        step = step + torch.eye(step.shape[-1], dtype=step.dtype)
        step = step / step.sum(-1, keepdim=True)
        if grid is not None and layer.layout.grid != grid:
            (gh, gw), (mh, mw) = grid, layer.layout.grid
            merge = torch.zeros(mh * mw, gh * gw, dtype=torch.float64)
            for r in range(gh):
                for c in range(gw):  # an odd edge (7 -> 4 here) merges fewer real tokens
                    sources = min(2, gh - r // 2 * 2) * min(2, gw - c // 2 * 2)
                    merge[(r // 2) * mw + c // 2, r * gw + c] = 1 / sources
            joint = merge @ joint
        joint = step if joint is None else step @ joint
        grid = layer.layout.grid
    expected = joint.mean(1).view(2, 28, 28).float()
    assert result.maps.shape == (2, 28, 28) and result.layout.grid == (28, 28)
    torch.testing.assert_close(result.maps, expected)
    torch.testing.assert_close(result.maps.sum((1, 2)), torch.ones(2))


def test_rollout_refuses_stages_joined_by_convolutions():
    model, x = family("pit")
    with pytest.raises(ValueError, match="convolutions or pooling between stages"):
        vk.rollout(model, x)


def test_hiera_refuses_a_grid_for_unrolled_tokens():
    model, x = family("hiera")
    hm = vk.HookedModel(model)
    with pytest.raises(ValueError, match="unrolled order"):
        hm.token_layout(x.shape[-2:], "blocks.0.hook_resid_post")
    with pytest.raises(ValueError, match="unrolled"):
        vk.gradcam(model, x, layer="blocks.0.hook_resid_post")
    assert vk.gradcam(model, x).maps.shape == (2, 7, 7)  # the raster last stage


def test_derived_values_are_read_only():
    model, x = family("beit")
    hm = vk.HookedModel(model)
    with (
        pytest.raises(ValueError, match="derived"),
        hm.hooks(fwd={"blocks.0.attn.hook_pos_bias": lambda t, name: t + 1}),
    ):
        hm(x)
    with pytest.raises(ValueError, match="no gradient"):
        hm.run_with_cache(x, names="blocks.0.attn.hook_pos_bias", grads=True)


def test_naflex_patch_dicts_are_refused():
    model, x = family("naflexvit")
    with pytest.raises(TypeError, match="image batch tensor"):
        vk.attention(model, {"patches": x})


@pytest.mark.parametrize("key", ADAPTED)
def test_hook_names_snapshot(key):
    model, _ = family(key)
    names = vk.HookedModel(model).hook_names()
    path = SNAPSHOTS / "families" / f"{key}.txt"
    if os.environ.get("VIZKIT_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text("\n".join(names) + "\n")
    assert names == path.read_text().splitlines()


# the representative's Swin-T widths made the report's evaluation 30 s; the windows, shifts
# and merges are what this test is about, and they do not depend on the width
NARROW = {"swin_transformer": {"embed_dim": 24, "num_heads": (1, 2, 4, 8)}}


@pytest.mark.parametrize("key", ["swin_transformer", "eva", "vision_transformer"])
def test_report_sections_run_or_say_why(key):
    """Every report section builds on the family or raises NotApplicable with its reason."""
    from vizkit.report import ReportInputs
    from vizkit.report.sections import SECTIONS, NotApplicable

    model, x = family(key, **NARROW.get(key, {}))
    inputs = ReportInputs(key, model, {}, x, "two random images")
    built, skipped = [], {}
    for name, build in SECTIONS.items():
        try:
            built.append(build(inputs))
        except NotApplicable as reason:
            skipped[name] = str(reason)
    titles = [section.title for section in built]
    for expected in ("Attention", "Saliency methods compared", "Residual-norm ratios"):
        assert expected in titles, (expected, skipped)
    assert all(reason for reason in skipped.values())


def test_residual_ratios_with_layerscale_on_windows_and_pooling_shortcuts():
    """MaxxViT (LayerScale, windowed attention): the unscaled branch is the whole partitioned
    attention over ||x||; MViTv2's pooling blocks: x_l is the pooled, projected shortcut the
    branch is added to, not the block's larger input."""
    torch.manual_seed(0)
    model = timm.create_model("maxxvit_rmlp_nano_rw_256", img_size=128, depths=(1, 1, 1, 1)).eval()
    x = torch.randn(2, 3, 128, 128)
    result = vk.residual_ratios(model, x)
    block, seen = model.stages[0].blocks[0].attn_block, {}
    handle = block.register_forward_hook(lambda m, a, o: seen.update(x=a[0]))
    try:
        with torch.no_grad():
            model(x)
            branch = block._partition_attn(block.norm1(seen["x"]))
    finally:
        handle.remove()
    expected = (branch.flatten(1).norm(dim=1) / seen["x"].flatten(1).norm(dim=1)).mean()
    assert result.layers[0] == "stages.0.blocks.0.attn_block"
    torch.testing.assert_close(result.attn_unscaled[0], expected.double(), rtol=1e-5, atol=0)

    model, x = family("mvitv2")
    block, seen = model.stages[1].blocks[0], {}
    handle = block.register_forward_hook(lambda m, a, o: seen.update(x=a[0], size=a[1]))
    try:
        result = vk.residual_ratios(model, x)
        with torch.no_grad():
            model(x)
            normed = block.norm1(seen["x"])
            shortcut = (
                seen["x"] if block.shortcut_proj_attn is None else block.shortcut_proj_attn(normed)
            )
            shortcut = block._shortcut_pool(shortcut, seen["size"])
            attn_out = block.attn(normed, seen["size"])[0]
    finally:
        handle.remove()
    expected = (attn_out.flatten(1).norm(dim=1) / shortcut.flatten(1).norm(dim=1)).mean()
    assert shortcut.shape[1] < seen["x"].shape[1]  # the block pools
    torch.testing.assert_close(
        result.attn[result.layers.index("stages.1.blocks.0")], expected.double()
    )


def test_partitioned_activations_have_no_per_image_map():
    model, x = family("maxxvit")
    with pytest.raises(ValueError, match="items on its batch axis"):
        vk.gradcam(model, x, layer="stages.0.blocks.0.attn_block.attn.hook_out")
    with pytest.raises(ValueError, match="items on its batch axis"):
        vk.cka_matrix(
            model,
            torch.cat([x, x]),
            layers=["stages.0.blocks.0.attn_block.attn.hook_out"],
            progress=False,
        )


def test_embedding_and_pooling_layouts():
    """The patch embedding holds patches only; a MAP head that strips the prefix tokens reads
    the last block's grid; rollout through it pads the skipped prefix."""
    model, x = family("deit")
    layout = vk.HookedModel(model).token_layout(x.shape[-2:], "hook_embed")
    assert layout.num_prefix_tokens == 0 and not layout.class_token
    torch.manual_seed(0)
    naflex = timm.create_model(
        "naflexvit_base_patch16_map", depth=2, embed_dim=64, num_heads=2
    ).eval()
    x = torch.randn(2, 3, 64, 64)
    assert vk.class_attention(naflex, x).maps.shape == (2, 4, 4)
    assert vk.rollout(naflex, x).maps.shape == (2, 4, 4)


def test_average_pooled_models_explain_the_patches_not_the_class_token():
    model, x = family("beit")  # global_pool="avg": the head never reads the class token
    assert model.global_pool == "avg"
    result = vk.grad_rollout(model, x)
    hm = vk.HookedModel(model)
    names = vk.analysis.self_attention_names(hm)
    _, cache = hm.run_with_cache(x, names=names, grads=True)
    relevance = None
    for name in names:
        weighted = (cache[f"{name}_grad"] * cache[name]).clamp_min(0).mean(1).double()
        eye = torch.eye(weighted.shape[-1], dtype=weighted.dtype)
        relevance = eye + weighted if relevance is None else relevance + weighted @ relevance
    expected = relevance[:, 1:, 1:].mean(1).view(2, 4, 4).float()
    torch.testing.assert_close(result.maps, expected)


def test_crossvit_crop_scale_and_naflex_padding():
    torch.manual_seed(0)
    cropped = timm.create_model("crossvit_tiny_240", depth=[[1, 1, 0]] * 2, crop_scale=True).eval()
    with pytest.raises(ValueError, match="centre 224x224 crop"):
        vk.class_attention(cropped, torch.randn(2, 3, 240, 240))
    padded = timm.create_model(
        "naflexvit_base_patch16_gap", depth=2, embed_dim=64, num_heads=2, dynamic_img_pad=True
    ).eval()
    result = vk.attention(padded, torch.randn(1, 3, 72, 72), layers=[1], query=(1, 0))
    assert result.layout.grid == (5, 5) and result.query == padded.num_prefix_tokens + 5
