"""torchvision's Swin Transformer (V1, V2) and MaxViT (random-init small configs, nothing
downloaded). Their attention maps are recomputed from the attention module's input (torchvision
hands them to no module); oracles: the map times the values gives the module's output for every
window, and the maps put back on the grid equal an independent image-space recompute (token pairs
by their coordinates, the shift regions and the relative offsets) with rows summing to 1. Also:
the hook names of every block, the hooked output equal to the plain one, no hook left attached,
and the analyses with their shapes or their refusals."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import hooks_on

import vizkit as vk
from vizkit.hooks.readers import ComputedReader
from vizkit.hooks.windows import WindowGeometry, windows_to_grid

torchvision = pytest.importorskip("torchvision")

import vizkit.families.torchvision.maxvit  # noqa: E402, F401  (registers the families)
import vizkit.families.torchvision.swin  # noqa: E402, F401

SWIN_BLOCKS = ["features.1.0", "features.1.1", "features.3.0", "features.3.1"]
RESIDUAL = ["hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"]


def _images(batch: int, height: int, width: int | None = None) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(batch, 3, height, width or height, generator=generator)


def build_swin(v2: bool = False) -> torch.nn.Module:
    """Two stages of two blocks, window 4 (the second block of each stage shifted by 2), the
    position tables and biases widened so that a misplaced entry cannot hide in a tolerance."""
    from torchvision.models import swin_transformer as swin

    torch.manual_seed(0)
    extra = {"block": swin.SwinTransformerBlockV2, "downsample_layer": swin.PatchMergingV2}
    model = torchvision.models.SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4],
        num_classes=5, **(extra if v2 else {}),
    ).eval()  # fmt: skip
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("relative_position_bias_table", "qkv.bias", "head.weight")):
                param.normal_()
            elif name.endswith("logit_scale"):
                param.uniform_(0.5, 3.0)
    return model


def build_maxvit(layers: list[int] | None = None) -> torch.nn.Module:
    """32 px: stem 16x16, stages 8x8 and 4x4, partition 2 (block windows 2x2; grid attention
    over a dilated 2x2 grid: stride 4 in the first stage, 2 in the second)."""
    torch.manual_seed(0)
    layers = layers or [1, 1]
    model = torchvision.models.MaxVit(
        input_size=(32, 32), stem_channels=8, partition_size=2,
        block_channels=[16, 32][: len(layers)], block_layers=layers, head_dim=8,
        stochastic_depth_prob=0.0, num_classes=5,
    ).eval()  # fmt: skip
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("relative_position_bias_table", "to_qkv.weight")):
                param.normal_()
    return model


def _capture(module: torch.nn.Module, model: torch.nn.Module, x: torch.Tensor):
    """The input and output of ``module`` in a plain forward of ``model``."""
    seen = {}
    handle = module.register_forward_hook(lambda m, a, o: seen.update(x=a[0], out=o))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return seen["x"], seen["out"]


def _check_name_invariants(hm: vk.HookedModel, model: torch.nn.Module) -> None:
    names = hm.hook_names()
    modules = dict(model.named_modules())
    assert len(names) == len(set(names))
    assert all(n.rsplit(".", 1)[-1].startswith("hook_") for n in names)
    assert all(hm.tap(n).module in modules for n in names)


# -- Swin ------------------------------------------------------------------------------------


@pytest.mark.parametrize("v2", [False, True])
def test_swin_names_layout_and_unchanged_output(v2):
    model, x = build_swin(v2), _images(2, 32)
    hm = vk.HookedModel(model)
    names = hm.hook_names()
    _check_name_invariants(hm, model)
    for block in SWIN_BLOCKS:
        for leaf in RESIDUAL:
            assert f"{block}.{leaf}" in names
        tap = hm.tap(f"{block}.attn.hook_pattern")
        assert (tap.kind, tap.shape) == ("window", "B·nW H w² w²")
        assert isinstance(tap.read, ComputedReader)
    assert {"hook_embed", "hook_final_norm", "features.1.hook_out"} <= set(names)
    layout = hm.token_layout((32, 32))
    assert (layout.num_prefix_tokens, layout.grid, layout.class_token) == (0, (8, 8), False)
    grids = [hm.token_layout((32, 32), f"{b}.hook_resid_post").grid for b in SWIN_BLOCKS]
    assert grids == [(8, 8), (8, 8), (4, 4), (4, 4)]
    assert hm.family.merges_patches
    plain = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # qkv / proj: weights read by the functional, not called
        out, cache = hm.run_with_cache(x, names="*")
    torch.testing.assert_close(out, plain, atol=0, rtol=0)
    assert cache["features.1.0.hook_resid_post"].shape == (2, 64, 16)
    assert cache["features.3.1.attn.hook_pattern"].shape == (2, 2, 16, 16)  # one window, grid 4
    assert cache["features.1.1.attn.hook_pos_bias"].shape == (2, 16, 16)
    # the shared stochastic_depth: first call closes the attention branch, second the MLP's
    for block in SWIN_BLOCKS:
        torch.testing.assert_close(
            cache[f"{block}.hook_resid_mid"],
            cache[f"{block}.hook_resid_pre"] + cache[f"{block}.hook_attn_out"],
        )
        torch.testing.assert_close(
            cache[f"{block}.hook_resid_post"],
            cache[f"{block}.hook_resid_mid"] + cache[f"{block}.hook_mlp_out"],
        )
    assert not hooks_on(model)


def _swin_output_from(attn, x: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """The attention module's output rebuilt from its window maps: each window's map times its
    values, projected, the windows put back, the shift undone and the padding cut (the steps of
    torchvision's ``shifted_window_attention`` around its softmax)."""
    batch, height, width, channels = x.shape
    (wh, ww), heads = attn.window_size, attn.num_heads
    xp = F.pad(x, (0, 0, 0, -width % ww, 0, -height % wh))
    ph, pw = xp.shape[1:3]
    sh = attn.shift_size[0] if wh < ph else 0
    sw = attn.shift_size[1] if ww < pw else 0
    xp = torch.roll(xp, (-sh, -sw), (1, 2))
    windows = xp.view(batch, ph // wh, wh, pw // ww, ww, channels).permute(0, 1, 3, 2, 4, 5)
    windows = windows.reshape(-1, wh * ww, channels)
    v = F.linear(windows, attn.qkv.weight[2 * channels :], attn.qkv.bias[2 * channels :])
    v = v.view(len(windows), wh * ww, heads, -1).transpose(1, 2)
    out = attn.proj((pattern @ v).transpose(1, 2).reshape(len(windows), wh * ww, channels))
    out = out.view(batch, ph // wh, pw // ww, wh, ww, channels).permute(0, 1, 3, 2, 4, 5)
    out = torch.roll(out.reshape(batch, ph, pw, channels), (sh, sw), (1, 2))
    return out[:, :height, :width]


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("size", [(32, 32), (24, 24), (32, 64)])  # 24: padded grids 6 and 3
def test_swin_maps_times_values_give_the_attention_output(v2, size):
    """For every block and window: map @ v, projected and put back, is the module's output
    (also where torchvision pads the grid and drops the shift)."""
    model, x = build_swin(v2), _images(2, *size)
    hm = vk.HookedModel(model)
    names = [f"{b}.attn.hook_pattern" for b in SWIN_BLOCKS]
    with torch.no_grad():
        out, cache = hm.run_with_cache(x, names=names)
    torch.testing.assert_close(out, model(x), atol=0, rtol=0)
    for block, name in zip(SWIN_BLOCKS, names, strict=True):
        attn = model.get_submodule(f"{block}.attn")
        inp, expected = _capture(attn, model, x)
        pattern = cache[name]
        assert pattern.min() >= 0
        torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))
        with torch.no_grad():
            torch.testing.assert_close(_swin_output_from(attn, inp, pattern), expected)
    assert not hooks_on(model)


def _cpb_table(attn) -> torch.Tensor:
    """Swin V2's (2wh - 1, 2ww - 1, H) bias table: 16 sigmoid(MLP(log-spaced offsets)), the
    offsets built here (Liu et al. 2022, Eq. 4)."""
    (wh, ww) = attn.window_size
    dy, dx = torch.meshgrid(
        torch.arange(1 - wh, wh) / (wh - 1) * 8, torch.arange(1 - ww, ww) / (ww - 1) * 8,
        indexing="ij",
    )  # fmt: skip
    coords = torch.stack([dy, dx], -1)
    coords = torch.sign(coords) * torch.log2(coords.abs() + 1) / 3
    return 16 * torch.sigmoid(attn.cpb_mlp(coords))


def _swin_oracle(attn, x: torch.Tensor, v2: bool) -> torch.Tensor:
    """(B, H, Np, Np) image-space map from the block's weights, token pair by token pair: t
    attends to u iff both lie in the same window of the map cyclically shifted by s and in the
    same region of the shift; logits q k^T / sqrt(d) (V2: cos(q, k) times the clamped learned
    temperature, without the key bias) plus the bias of their offset. torchvision drops the
    shift along a side of at most one window. x: (B, gh, gw, C), sides multiples of the window."""
    batch, gh, gw, channels = x.shape
    (wh, ww), heads = attn.window_size, attn.num_heads
    sh = attn.shift_size[0] if gh > wh else 0
    sw = attn.shift_size[1] if gw > ww else 0
    bias = attn.qkv.bias.clone()
    if v2:
        bias[channels : 2 * channels] = 0
    qkv = F.linear(x.reshape(batch, gh * gw, channels), attn.qkv.weight, bias)
    q, k, _ = qkv.reshape(batch, gh * gw, 3, heads, -1).permute(2, 0, 3, 1, 4)
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ((rows - sh) % gh).flatten(), ((cols - sw) % gw).flatten()  # on the shifted map

    def region(p, g, w, s):  # the three slices of the shift mask
        return (p >= g - w).long() + (p >= g - s).long() if s else torch.zeros_like(p)

    same = ((ys[:, None] // wh) == (ys[None] // wh)) & ((xs[:, None] // ww) == (xs[None] // ww))
    same &= region(ys, gh, wh, sh)[:, None] == region(ys, gh, wh, sh)[None]
    same &= region(xs, gw, ww, sw)[:, None] == region(xs, gw, ww, sw)[None]
    if v2:
        temperature = attn.logit_scale.clamp(max=math.log(100)).exp()
        logits = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1) * temperature
        table = _cpb_table(attn)
    else:
        logits = (q / math.sqrt(channels // heads)) @ k.transpose(-2, -1)
        table = attn.relative_position_bias_table.view(2 * wh - 1, 2 * ww - 1, heads)
    dy = (ys % wh)[:, None] - (ys % wh)[None]
    dx = (xs % ww)[:, None] - (xs % ww)[None]
    placed = table[dy + wh - 1, dx + ww - 1].permute(2, 0, 1)
    return (logits + placed).masked_fill(~same, float("-inf")).softmax(-1)


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("size", [(32, 32), (32, 64)])  # 32x64: stage 1 shifts along w only
def test_swin_image_space_maps_equal_an_independent_recompute(v2, size):
    model, x = build_swin(v2), _images(2, *size)
    hm = vk.HookedModel(model)
    stage_grid = {0: (size[0] // 4, size[1] // 4), 1: (size[0] // 8, size[1] // 8)}
    for i, block in enumerate(SWIN_BLOCKS):
        attn = model.get_submodule(f"{block}.attn")
        inp, _ = _capture(attn, model, x)
        with torch.no_grad():
            result = vk.attention(model, x, layers=i)
            expected = _swin_oracle(attn, inp, v2)
        grid = stage_grid[i // 2]
        assert result.layout.grid == grid
        assert result.patterns.shape == (1, 2, 2, grid[0] * grid[1], grid[0] * grid[1])
        torch.testing.assert_close(result.patterns[0], expected, atol=1e-6, rtol=1e-5)
        sums = result.patterns.sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums))
    # the geometry the maps were placed by: the shift torchvision applied on these grids
    shifts = [hm.tap(f"{b}.attn.hook_pattern").geometry() for b in SWIN_BLOCKS]
    assert shifts[1] == WindowGeometry((4, 4), (2, 2))  # before any forward: as declared
    with torch.no_grad():
        hm.run_with_cache(x, names="*.attn.hook_pattern")
    shifts = [hm.tap(f"{b}.attn.hook_pattern").geometry().shift for b in SWIN_BLOCKS]
    assert shifts == [(0, 0), (2, 2), (0, 0), (0, 0) if size == (32, 32) else (0, 2)]


def test_swin_position_bias_is_the_table_by_offset():
    model, x = build_swin(), _images(2, 32)
    with torch.no_grad():
        _, cache = vk.HookedModel(model).run_with_cache(x, names="features.1.0.attn.hook_pos_bias")
    attn = model.features[1][0].attn
    pos = torch.arange(16)
    dy = (pos // 4)[:, None] - (pos // 4)[None]
    dx = (pos % 4)[:, None] - (pos % 4)[None]
    table = attn.relative_position_bias_table.view(7, 7, 2)
    torch.testing.assert_close(cache["features.1.0.attn.hook_pos_bias"],
                               table[dy + 3, dx + 3].permute(2, 0, 1))  # fmt: skip


@pytest.mark.parametrize("v2", [False, True])
def test_swin_analyses_run_with_their_shapes(v2):
    model, x = build_swin(v2), _images(4, 32)
    first = vk.attention(model, x, layers=[0, 1])
    second = vk.attention(model, x, layers="features.3.*")
    assert first.patterns.shape == (2, 4, 2, 64, 64) and first.patch_size == (4.0, 4.0)
    assert second.patterns.shape == (2, 4, 2, 16, 16) and second.patch_size == (8.0, 8.0)
    # rollout through the patch merging: per layer (A + I) / 2 of the head-mean map, each
    # merged token the mean of its 2 x 2 sources, written out with loops
    result = vk.rollout(model, x)
    joint = None
    for stage, layers in enumerate((first, second)):
        for patterns in layers.patterns:
            step = patterns.double().mean(1)
            step = step + torch.eye(step.shape[-1], dtype=step.dtype)
            step = step / step.sum(-1, keepdim=True)
            if stage == 1 and joint.shape[1] == 64:
                merge = torch.zeros(16, 64, dtype=torch.float64)
                for r in range(8):
                    for c in range(8):
                        merge[(r // 2) * 4 + c // 2, r * 8 + c] = 0.25
                joint = merge @ joint
            joint = step if joint is None else step @ joint
    assert result.maps.shape == (4, 8, 8)
    torch.testing.assert_close(result.maps, joint.mean(1).view(4, 8, 8).float())
    torch.testing.assert_close(result.maps.sum((1, 2)), torch.ones(4))
    # Grad-CAM: the last block's output by default, equal to the computation by hand
    cam = vk.gradcam(model, x, target=1)
    assert cam.options["layer"] == "features.3.1.hook_resid_post"
    feature = {}
    handle = model.features[3].register_forward_hook(lambda m, a, o: feature.update(a=o))
    try:
        grad = torch.autograd.grad(model(x)[:, 1].sum(), feature["a"])[0]  # (B, h, w, C)
    finally:
        handle.remove()
    expected = (grad.mean((1, 2), keepdim=True) * feature["a"]).sum(-1).clamp_min(0)
    assert cam.maps.shape == (4, 4, 4)
    torch.testing.assert_close(cam.maps, expected.detach())
    stage_cam = vk.gradcam(model, x, target=1, layer="features.3.hook_out")
    torch.testing.assert_close(stage_cam.maps, expected.detach())
    assert vk.cka_matrix(model, x, progress=False).matrix.shape == (4, 4)
    norms = vk.token_norms(model, x, layers="features.3.*")
    assert norms.patches.shape == (4, 2, 4, 4) and norms.prefix.shape == (4, 2, 0)
    assert not hooks_on(model)


@pytest.mark.parametrize("v2", [False, True])
def test_swin_residual_ratios_equal_the_branches_by_hand(v2):
    """r^SA = ||attention branch|| / ||x||, r^FFN = ||MLP branch|| / ||x'|| (per image, mean
    over the batch); V2 normalizes after each branch (post-norm)."""
    model, x = build_swin(v2), _images(2, 32)
    result = vk.residual_ratios(model, x)
    assert result.layers == SWIN_BLOCKS
    block = model.features[1][1]
    inp, _ = _capture(block, model, x)
    with torch.no_grad():
        if v2:
            attn_branch = block.norm1(block.attn(inp))
            mid = inp + attn_branch
            mlp_branch = block.norm2(block.mlp(mid))
        else:
            attn_branch = block.attn(block.norm1(inp))
            mid = inp + attn_branch
            mlp_branch = block.mlp(block.norm2(mid))

    def ratio(a, b):
        return (a.flatten(1).norm(dim=1) / b.flatten(1).norm(dim=1)).mean().double()

    torch.testing.assert_close(result.attn[1], ratio(attn_branch, inp), rtol=1e-5, atol=0)
    torch.testing.assert_close(result.mlp[1], ratio(mlp_branch, mid), rtol=1e-5, atol=0)
    assert not any(result.has_layerscale)


def test_swin_refusals():
    model = build_swin()
    x = _images(4, 32)
    with pytest.raises(ValueError, match="cannot be stacked"):
        vk.attention(model, x, layers=[1, 2])  # two stages, two grids
    with pytest.raises(ValueError, match="hold different tokens"):
        vk.token_norms(model, x, layers=[1, 2])
    with pytest.raises(ValueError, match="not a multiple of the 4x4 windows"):
        vk.attention(model, _images(2, 24), layers=0)  # a 6x6 grid, padded by the model
    with pytest.raises(ValueError, match="class token"):
        vk.grad_rollout(model, x)
    hm = vk.HookedModel(model)
    with pytest.raises(ValueError, match="derived values"):
        hm.run_with_cache(x, names="features.1.0.attn.hook_pattern", grads=True)
    with pytest.raises(ValueError, match="derived"):
        with hm.hooks(fwd={"features.1.0.attn.hook_pattern": lambda p, name: p * 0}):
            hm(x)
    assert not hooks_on(model)


# -- MaxViT ----------------------------------------------------------------------------------

MAXVIT_BLOCKS = [
    f"blocks.{s}.layers.0.layers.{part}"
    for s in range(2)
    for part in ("window_attention", "grid_attention")
]


def test_maxvit_names_layout_and_unchanged_output():
    model, x = build_maxvit(), _images(2, 32)
    hm = vk.HookedModel(model)
    names = hm.hook_names()
    _check_name_invariants(hm, model)
    for block in MAXVIT_BLOCKS:
        for leaf in RESIDUAL:
            assert f"{block}.{leaf}" in names
        tap = hm.tap(f"{block}.attn_layer.1.hook_pattern")
        assert (tap.kind, tap.shape) == ("window", "B·nW H w² w²")
        assert isinstance(tap.read, ComputedReader)
    geometries = [hm.tap(f"{b}.attn_layer.1.hook_pattern").geometry() for b in MAXVIT_BLOCKS]
    assert geometries == [WindowGeometry((2, 2), dilated=d) for d in (False, True, False, True)]
    grids = [hm.token_layout((32, 32), f"{b}.hook_resid_post").grid for b in MAXVIT_BLOCKS]
    assert grids == [(8, 8), (8, 8), (4, 4), (4, 4)]
    plain = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, cache = hm.run_with_cache(x, names="*")
    torch.testing.assert_close(out, plain, atol=0, rtol=0)
    assert cache[f"{MAXVIT_BLOCKS[0]}.attn_layer.1.hook_pattern"].shape == (2 * 16, 2, 4, 4)
    assert cache[f"{MAXVIT_BLOCKS[3]}.attn_layer.1.hook_pattern"].shape == (2 * 4, 4, 4, 4)
    # the branches, read in the partitioned layout, sit on the grid with the block's ends
    for block in MAXVIT_BLOCKS:
        pre, post = cache[f"{block}.hook_resid_pre"], cache[f"{block}.hook_resid_post"]
        assert cache[f"{block}.hook_attn_out"].shape == pre.shape
        torch.testing.assert_close(cache[f"{block}.hook_resid_mid"],
                                   pre + cache[f"{block}.hook_attn_out"])  # fmt: skip
        torch.testing.assert_close(post, cache[f"{block}.hook_resid_mid"]
                                   + cache[f"{block}.hook_mlp_out"])  # fmt: skip
    assert not hooks_on(model)


def test_maxvit_branch_edits_are_put_back_in_the_partitioned_layout():
    """Zeroing one grid token of the grid-attention branch (edited on the grid, written back
    through the partition) changes exactly that token of the block's output."""
    model, x = build_maxvit(), _images(2, 32)
    hm = vk.HookedModel(model)
    block = MAXVIT_BLOCKS[1]
    names = [f"{block}.hook_attn_out", f"{block}.hook_resid_mid"]
    with torch.no_grad():
        _, before = hm.run_with_cache(x, names=names)

    def zero_token(t, *, name):
        t = t.clone()
        t[:, 9] = 0  # row 1, column 1 of the 8x8 grid
        return t

    with torch.no_grad(), hm.hooks(fwd={f"{block}.hook_attn_out": zero_token}):
        _, after = hm.run_with_cache(x, names=names)
    changed = (after[names[1]] - before[names[1]]).abs().amax(-1)  # (B, Np)
    assert changed[:, 9].min() > 0
    assert changed[:, [i for i in range(64) if i != 9]].max() == 0
    torch.testing.assert_close(after[names[1]][:, 9], before[names[1]][:, 9]
                               - before[names[0]][:, 9])  # fmt: skip
    assert not hooks_on(model)


@pytest.mark.parametrize("block", MAXVIT_BLOCKS)
def test_maxvit_maps_times_values_give_the_attention_output(block):
    model, x = build_maxvit(), _images(2, 32)
    name = f"{block}.attn_layer.1.hook_pattern"
    with torch.no_grad():
        _, cache = vk.HookedModel(model).run_with_cache(x, names=name)
    attn = model.get_submodule(f"{block}.attn_layer.1")
    inp, expected = _capture(attn, model, x)  # (B, G, P², C)
    batch, groups, tokens, channels = inp.shape
    with torch.no_grad():
        v = attn.to_qkv(inp)[..., 2 * channels :]
        v = v.reshape(batch * groups, tokens, attn.n_heads, -1).transpose(1, 2)
        out = (cache[name] @ v).transpose(1, 2).reshape(batch, groups, tokens, channels)
        torch.testing.assert_close(attn.merge(out), expected)
    sums = cache[name].sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums))


def _maxvit_oracle(block, x: torch.Tensor) -> torch.Tensor:
    """(B, H, Np, Np) image-space map of one partition block from its (B, C, gh, gw) input,
    token pair by token pair: block attention joins the tokens of one p x p window, grid
    attention those of one dilated grid (t = (i n + a, j n + b), n = gh / p, window (a, b));
    logits q k^T / sqrt(C) (torchvision scales by the feature width) plus the bias of their
    offset inside the window."""
    batch, channels, gh, gw = x.shape
    attn, p = block.attn_layer[1], block.attn_layer[1].size
    heads = attn.n_heads
    tokens = block.attn_layer[0](x.flatten(2).transpose(1, 2))
    q, k, _ = attn.to_qkv(tokens).chunk(3, -1)
    q, k = (t.reshape(batch, gh * gw, heads, -1).transpose(1, 2) for t in (q, k))
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    if block.partition_type == "window":
        window = (rows // p) * gw + cols // p
        pos_y, pos_x = rows % p, cols % p
    else:
        n = gh // p
        window = (rows % n) * gw + cols % n
        pos_y, pos_x = rows // n, cols // n
    same = window[:, None] == window[None]
    dy, dx = pos_y[:, None] - pos_y[None], pos_x[:, None] - pos_x[None]
    table = attn.relative_position_bias_table.view(2 * p - 1, 2 * p - 1, heads)
    placed = table[(dy + p - 1).clamp(0, 2 * p - 2), (dx + p - 1).clamp(0, 2 * p - 2)]
    logits = q @ k.transpose(-2, -1) / math.sqrt(channels) + placed.permute(2, 0, 1)
    return logits.masked_fill(~same, float("-inf")).softmax(-1)


def test_maxvit_image_space_maps_equal_an_independent_recompute():
    model, x = build_maxvit(), _images(2, 32)
    hm = vk.HookedModel(model)
    names = [f"{b}.attn_layer.1.hook_pattern" for b in MAXVIT_BLOCKS]
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names=names)
    for block, name in zip(MAXVIT_BLOCKS, names, strict=True):
        layer = model.get_submodule(block)
        inp, _ = _capture(layer, model, x)
        grid = hm.token_layout((32, 32), name).grid
        placed = windows_to_grid(cache[name], grid, hm.tap(name).geometry())
        with torch.no_grad():
            expected = _maxvit_oracle(layer, inp)
        assert placed.shape == expected.shape == (2, layer.n_heads, *(2 * (grid[0] * grid[1],)))
        torch.testing.assert_close(placed, expected, atol=1e-6, rtol=1e-5)
        sums = placed.sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums))


def test_maxvit_analyses_run_with_their_shapes():
    model, x = build_maxvit(), _images(4, 32)
    cam = vk.gradcam(model, x, target=1)
    assert cam.options["layer"] == f"{MAXVIT_BLOCKS[-1]}.hook_resid_post"
    feature = {}
    handle = model.blocks[1].register_forward_hook(lambda m, a, o: feature.update(a=o))
    try:
        grad = torch.autograd.grad(model(x)[:, 1].sum(), feature["a"])[0]  # (B, C, h, w)
    finally:
        handle.remove()
    expected = (grad.mean((2, 3), keepdim=True) * feature["a"]).sum(1).clamp_min(0)
    assert cam.maps.shape == (4, 4, 4)
    torch.testing.assert_close(cam.maps, expected.detach())
    assert vk.cka_matrix(model, x, progress=False).matrix.shape == (4, 4)
    norms = vk.token_norms(model, x, layers="blocks.0.*")
    assert norms.patches.shape == (4, 2, 8, 8)
    ratios = vk.residual_ratios(model, x)
    assert ratios.layers == MAXVIT_BLOCKS
    block = model.get_submodule(MAXVIT_BLOCKS[1])  # grid attention: r^SA by hand
    inp, _ = _capture(block, model, x)
    with torch.no_grad():
        stream = block.partition_swap(block.partition_op(inp, block.p))
        branch = block.attn_layer(stream)
    expected = (branch.flatten(1).norm(dim=1) / stream.flatten(1).norm(dim=1)).mean()
    torch.testing.assert_close(ratios.attn[1], expected.double(), rtol=1e-5, atol=0)
    # one stage of one layer: block then grid attention with no convolution between them
    single = build_maxvit([1])
    rolled = vk.rollout(single, x)
    assert rolled.maps.shape == (4, 8, 8)
    torch.testing.assert_close(rolled.maps.sum((1, 2)), torch.ones(4))
    assert not hooks_on(model) and not hooks_on(single)


def test_maxvit_refusals():
    model, x = build_maxvit(), _images(4, 32)
    with pytest.raises(ValueError, match="convolutions or pooling between stages"):
        vk.rollout(model, x)
    with pytest.raises(ValueError, match="hold different tokens"):
        vk.token_norms(model, x, layers=[1, 2])
    hm = vk.HookedModel(model)
    name = f"{MAXVIT_BLOCKS[0]}.attn_layer.1.hook_pattern"
    with pytest.raises(ValueError, match="derived values"):
        hm.run_with_cache(x, names=name, grads=True)
    assert not hooks_on(model)


def test_maxvit_attention_analysis():
    model, x = build_maxvit(), _images(2, 32)
    result = vk.attention(model, x, layers=[0, 1])
    assert result.patterns.shape == (2, 2, 2, 64, 64)
    torch.testing.assert_close(result.patterns.sum(-1), torch.ones(2, 2, 2, 64))
