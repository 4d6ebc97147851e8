"""Hugging Face transformers' Swin, Swin V2, BEiT and Data2Vec-Vision (random-init small configs,
nothing downloaded): every layer's map equals the one transformers itself makes under eager
attention (the weights its attention module returns, which ``output_attentions=True`` collects),
for models built with eager and with sdpa attention (Swin V2 has no sdpa in transformers); the
hooked output equals the plain one; ``_attn_implementation`` is restored after every call, also
after a hook raises; the position biases equal an independent computation from the bias tables
and are what the maps add to their logits; the windows go back on the grid where transformers
took them from; and the analyses run with the right shapes or refuse with a clear ValueError."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import vizkit as vk

transformers = pytest.importorskip("transformers")

from test_transformers_families import check_a_failing_hook_restores_everything  # noqa: E402

import vizkit.families.transformers.beit  # noqa: E402  (registers the families)
import vizkit.families.transformers.swin  # noqa: E402
from vizkit.analysis.stages import Stages  # noqa: E402
from vizkit.hooks.windows import window_token_index  # noqa: E402

SWIN = {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [2, 2],
        "num_heads": [2, 2], "window_size": 4, "num_labels": 5}  # fmt: skip
BEIT = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 64, "use_relative_position_bias": True,
        "num_labels": 5}  # fmt: skip
KINDS = ("swin", "swinv2", "beit", "data2vec")
# (kind, implementation) pairs transformers supports: Swin V2 refuses sdpa (test below)
CASES = [(k, i) for k in KINDS for i in ("eager", "sdpa") if (k, i) != ("swinv2", "sdpa")]


def build(kind: str, attn_implementation: str = "sdpa", **overrides) -> nn.Module:
    """A small random-init classifier of ``kind``; the relative position tables (zeros at init)
    are filled with random values so that the biases matter."""
    torch.manual_seed(0)
    config, model, kwargs = {
        "swin": (transformers.SwinConfig, transformers.SwinForImageClassification, SWIN),
        "swinv2": (transformers.Swinv2Config, transformers.Swinv2ForImageClassification, SWIN),
        "beit": (transformers.BeitConfig, transformers.BeitForImageClassification, BEIT),
        "data2vec": (
            transformers.Data2VecVisionConfig, transformers.Data2VecVisionForImageClassification,
            BEIT,
        ),
    }[kind]  # fmt: skip
    built = model(config(attn_implementation=attn_implementation, **{**kwargs, **overrides}))
    with torch.no_grad():
        for name, parameter in built.named_parameters():
            if name.endswith("relative_position_bias_table"):
                parameter.normal_()
    return built.eval()


def images(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def implementations(model: nn.Module) -> set[str]:
    return {m.config._attn_implementation for m in model.modules() if hasattr(m, "config")}


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The modules whose second output is the map, in forward order."""
    names = ("SwinAttention", "Swinv2SelfAttention", "BeitAttention",
             "Data2VecVisionSelfAttention")  # fmt: skip
    return [m for m in model.modules() if type(m).__name__ in names]


def eager_reference(kind: str, model: nn.Module, x: torch.Tensor):
    """transformers' own maps: an eager model with ``model``'s weights, run with
    ``output_attentions=True``; returns its output and every attention module's returned
    weights (``output_attentions`` keeps only each stage's last block for Swin)."""
    reference = build(kind, "eager")
    reference.load_state_dict(model.state_dict())
    weights = []
    handles = [
        m.register_forward_hook(lambda mod, args, out: weights.append(out[1].detach()))
        for m in attention_modules(reference)
    ]
    try:
        with torch.no_grad():
            out = reference(x, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    return out, weights


def blocks_of(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ in ("SwinLayer", "Swinv2Layer")]


# -- oracles -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "implementation"), CASES)
def test_maps_equal_transformers_own_and_the_output_is_unchanged(kind, implementation):
    model, x = build(kind, implementation), images()
    with torch.no_grad():
        plain = model(x).logits
    hm = vk.HookedModel(model)
    names = [n for n in hm.hook_names() if n.endswith(".hook_pattern")]
    out, cache = hm.run_with_cache(x, names=names)
    torch.testing.assert_close(out.logits, plain, atol=1e-5, rtol=0)
    assert implementations(model) == {implementation}

    reference, expected = eager_reference(kind, model, x)
    torch.testing.assert_close(reference.logits, plain, atol=1e-5, rtol=0)
    assert len(names) == len(expected) == (4 if kind.startswith("swin") else 2)
    # the per-module weights are what output_attentions collects (the last block per stage)
    last = [1, 3] if kind.startswith("swin") else [0, 1]
    for got, want in zip(reference.attentions, [expected[i] for i in last], strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    windows = [16, 16, 4, 4]  # B·nW: 4 images x (8/4)² windows, then 4 x (4/4)²
    for i, (name, want) in enumerate(zip(names, expected, strict=True)):
        got = cache[name]
        shape = (windows[i], 2, 16, 16) if kind.startswith("swin") else (4, 2, 17, 17)
        assert got.shape == shape, name
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert hm.tap(name).kind == ("window" if kind.startswith("swin") else "self")


@pytest.mark.parametrize("kind", ["swin", "beit"])
def test_gradients_at_the_maps_equal_autograd_through_transformers_maps(kind):
    model, x, target = build(kind), images(), torch.tensor([0, 1, 2, 3])
    hm = vk.HookedModel(model)
    names = [n for n in hm.hook_names() if n.endswith(".hook_pattern")]
    _, cache = hm.run_with_cache(x, names=names, grads=True, target=target)
    reference = build(kind, "eager")
    reference.load_state_dict(model.state_dict())
    weights = []
    for m in attention_modules(reference):
        m.register_forward_hook(lambda mod, args, out: weights.append(out[1]))
    score = reference(x).logits.gather(1, target[:, None]).sum()
    expected = torch.autograd.grad(score, weights)
    for name, want in zip(names, expected, strict=True):
        torch.testing.assert_close(cache[f"{name}_grad"], want, atol=1e-6, rtol=1e-4)
    assert not any(p.grad is not None for p in model.parameters())
    assert implementations(model) == {"sdpa"}


def test_swinv2_has_no_sdpa_in_transformers():
    """Why Swin V2 is tested under eager only: transformers refuses sdpa for it."""
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        build("swinv2", "sdpa")


@pytest.mark.parametrize("kind", ["swin", "beit"])
def test_a_failing_hook_restores_the_attention_implementation(kind):
    check_a_failing_hook_restores_everything(build(kind), images(2))


@pytest.mark.parametrize("kind", ["swin", "beit"])
def test_returned_maps_are_read_only(kind):
    """Swin's and BEiT's attention return their weights after computing the output from them:
    an edit would change nothing, so it is refused."""
    model, x = build(kind), images(2)
    hm = vk.HookedModel(model)
    name = next(n for n in hm.hook_names() if n.endswith(".hook_pattern"))
    with pytest.raises(ValueError, match="beside an output it has already computed"):
        with hm.hooks(fwd={name: lambda p, name: p * 0}):
            hm(x)
    assert implementations(model) == {"sdpa"}


@pytest.mark.parametrize("kind", ["swinv2", "data2vec"])
def test_maps_handed_to_a_dropout_child_can_be_edited(kind):
    """Swin V2's and eager Data2Vec's maps are read where the module multiplies them with the
    values: a uniform map replacing the first layer's changes the output."""
    model, x = build(kind, "eager"), images(2)
    hm = vk.HookedModel(model)
    name = next(n for n in hm.hook_names() if n.endswith(".hook_pattern"))
    with torch.no_grad():
        plain = model(x).logits
        with hm.hooks(fwd={name: lambda p, name: torch.full_like(p, 1 / p.shape[-1])}):
            edited = hm(x).logits
    assert not torch.allclose(edited, plain)


# -- position biases -------------------------------------------------------------------------


def beit_index(gh: int, gw: int) -> torch.Tensor:
    """(1 + gh gw)² indices into BEiT's table: the patch pairs' relative offsets, then the
    class token's row, column and self (Bao et al. 2022, Sec. 2.6), written out here."""
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    dy, dx = ys[:, None] - ys[None], xs[:, None] - xs[None]
    distances = (2 * gh - 1) * (2 * gw - 1)
    index = torch.empty(1 + gh * gw, 1 + gh * gw, dtype=torch.long)
    index[1:, 1:] = (dy + gh - 1) * (2 * gw - 1) + (dx + gw - 1)
    index[0, :] = distances  # class -> token
    index[:, 0] = distances + 1  # token -> class
    index[0, 0] = distances + 2  # class -> class
    return index


def table_bias(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(H, N, N) from an (entries, H) table."""
    return table.detach()[index].permute(2, 0, 1)


@pytest.mark.parametrize("kind", ["beit", "data2vec"])
@pytest.mark.parametrize("tables", ["own", "shared", "both"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_beit_position_bias_equals_the_tables(kind, tables, implementation):
    model = build(
        kind, implementation, use_relative_position_bias=tables != "shared",
        use_shared_relative_position_bias=tables != "own",
    )  # fmt: skip
    hm = vk.HookedModel(model)
    names = [n for n in hm.hook_names() if n.endswith(".hook_pos_bias")]
    assert len(names) == 2 and all(hm.tap(n).kind == "position" for n in names)
    _, cache = hm.run_with_cache(images(2), names=names)
    index = beit_index(4, 4)
    shared = [m for n, m in model.named_modules() if n.endswith(("shared_position_bias",
              "encoder.relative_position_bias"))]  # fmt: skip
    own = [m for n, m in model.named_modules()
           if n.endswith("relative_position_bias") and m not in shared]  # fmt: skip
    assert (len(own), len(shared)) == {"own": (2, 0), "shared": (0, 1), "both": (2, 1)}[tables]
    for i, name in enumerate(names):
        parts = [table_bias(m.relative_position_bias_table, index) for m in own[i : i + 1]]
        parts += [table_bias(m.relative_position_bias_table, index) for m in shared]
        torch.testing.assert_close(cache[name], sum(parts), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", ["beit", "data2vec"])
def test_beit_maps_at_another_resolution_equal_transformers_own(kind):
    """At 48 px (a 6 x 6 grid) transformers interpolates the bias tables; the maps, made with
    both biases (own and shared), still equal its own, also with ``interpolate_pos_encoding``."""
    model, x = build(kind, use_shared_relative_position_bias=True), torch.randn(2, 3, 48, 48)
    hm = vk.HookedModel(model)
    assert hm.token_layout((48, 48)).grid == (6, 6)
    reference = build(kind, "eager", use_shared_relative_position_bias=True)
    reference.load_state_dict(model.state_dict())
    for interpolate in (False, True):
        out, cache = hm.run_with_cache(
            x, names="*.hook_pattern", interpolate_pos_encoding=interpolate
        )
        with torch.no_grad():
            want = reference(x, output_attentions=True, interpolate_pos_encoding=interpolate)
        torch.testing.assert_close(out.logits, want.logits, atol=1e-5, rtol=0)
        got = cache.stack("hook_pattern")
        assert got.shape == (2, 2, 2, 37, 37)
        for layer, expected in zip(got, want.attentions, strict=True):
            torch.testing.assert_close(layer, expected, atol=1e-5, rtol=1e-5)


def test_beit_has_no_position_bias_without_tables():
    model = build("beit", use_relative_position_bias=False)
    assert not any(n.endswith(".hook_pos_bias") for n in vk.HookedModel(model).hook_names())


def test_swin_position_bias_equals_the_table():
    model = build("swin")
    hm = vk.HookedModel(model)
    names = [n for n in hm.hook_names() if n.endswith(".hook_pos_bias")]
    _, cache = hm.run_with_cache(images(2), names=names)
    ys, xs = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    index = (ys[:, None] - ys[None] + 3) * 7 + (xs[:, None] - xs[None] + 3)
    tables = [m.relative_position_bias_table for m in model.modules()
              if type(m).__name__ == "SwinRelativePositionBias"]  # fmt: skip
    assert len(names) == len(tables) == 4
    for name, table in zip(names, tables, strict=True):
        assert cache[name].shape == (2, 16, 16)
        torch.testing.assert_close(cache[name], table_bias(table, index))


def test_swinv2_position_bias_equals_its_continuous_bias():
    """16 sigmoid(MLP(log-spaced offsets)) (Liu et al. 2022, Eq. 4), the MLP applied by hand."""
    model = build("swinv2", "eager")
    hm = vk.HookedModel(model)
    names = [n for n in hm.hook_names() if n.endswith(".hook_pos_bias")]
    _, cache = hm.run_with_cache(images(2), names=names)
    offsets = torch.arange(-3, 4, dtype=torch.float32) / 3 * 8
    offsets = torch.sign(offsets) * torch.log2(offsets.abs() + 1) / 3
    coords = torch.stack(torch.meshgrid(offsets, offsets, indexing="ij"), -1)  # (7, 7, 2)
    ys, xs = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    dy, dx = ys[:, None] - ys[None] + 3, xs[:, None] - xs[None] + 3
    attns = [m for m in model.modules() if type(m).__name__ == "Swinv2SelfAttention"]
    assert len(names) == len(attns) == 4
    for name, attn in zip(names, attns, strict=True):
        first, _, second = attn.continuous_position_bias_mlp
        table = nn.functional.linear(torch.relu(first(coords)), second.weight)  # (7, 7, H)
        expected = 16 * torch.sigmoid(table[dy, dx].permute(2, 0, 1))
        torch.testing.assert_close(cache[name], expected.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("kind", "implementation"), CASES)
def test_each_map_is_the_softmax_of_its_logits_plus_the_position_bias(kind, implementation):
    """The first block's map, recomputed from its q and k projections and hook_pos_bias (Swin:
    an unshifted block, so no shift mask), equals the captured map."""
    model, x = build(kind, implementation), images(2)
    hm = vk.HookedModel(model)
    attn_name = next(n for n in hm.hook_names() if n.endswith(".hook_pattern"))
    path = attn_name.removesuffix(".hook_pattern")
    q, k = {
        "swin": ("q_proj", "k_proj"), "swinv2": ("query", "key"), "beit": ("q_proj", "k_proj"),
        "data2vec": ("query", "key"),
    }[kind]  # fmt: skip
    wanted = [attn_name, f"{path}.hook_pos_bias", f"{path}.{q}.hook_out", f"{path}.{k}.hook_out"]
    _, cache = hm.run_with_cache(x, names=wanted)
    pattern, bias = cache[attn_name], cache[f"{path}.hook_pos_bias"]
    heads = pattern.shape[1]
    query, key = (cache[n].unflatten(-1, (heads, -1)).transpose(1, 2) for n in wanted[2:])
    if kind == "swinv2":  # cosine attention with a learned, clamped temperature
        scale = model.get_submodule(path).logit_scale.detach().clamp(max=math.log(100)).exp()
        logits = nn.functional.normalize(query, dim=-1) @ nn.functional.normalize(key, dim=-1).mT
        logits = logits * scale
    else:
        logits = query @ key.mT / math.sqrt(query.shape[-1])
    torch.testing.assert_close(pattern, (logits + bias).softmax(-1), atol=1e-5, rtol=1e-5)


# -- windows ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["swin", "swinv2"])
def test_windows_are_read_where_transformers_takes_them_from(kind):
    """Each block's geometry is the window and shift its forward used (stage 2's 4 x 4 grid
    fits one window, so transformers drops its shift), and `window_token_index` gives the grid
    positions transformers' own ``torch.roll`` + ``window_partition`` put in each window."""
    model, x = build(kind, "eager"), images(2)
    hm = vk.HookedModel(model)
    names = [n for n in hm.hook_names() if n.endswith(".hook_pattern")]
    hm(x)
    modeling = transformers.models.swin.modeling_swin
    if kind == "swinv2":
        modeling = transformers.models.swinv2.modeling_swinv2
    seen = []
    for name, block in zip(names, blocks_of(model), strict=True):
        geometry = hm.tap(name).geometry()
        assert geometry.window == (block.window_size,) * 2
        assert geometry.shift == (block.shift_size,) * 2
        seen.append((geometry.window[0], geometry.shift[0]))
        grid = hm.token_layout((32, 32), name).grid
        positions = torch.arange(grid[0] * grid[1], dtype=torch.float32).view(1, *grid, 1)
        shifted = torch.roll(positions, (-block.shift_size,) * 2, dims=(1, 2))
        theirs = modeling.window_partition(shifted, block.window_size).reshape(
            -1, block.window_size**2
        )
        assert torch.equal(window_token_index(grid, geometry), theirs.long())
    assert seen == [(4, 0), (4, 2), (4, 0), (4, 0)]


@pytest.mark.parametrize("kind", ["swin", "swinv2"])
def test_window_maps_on_the_grid_are_row_stochastic(kind):
    model, x = build(kind, "eager"), images(2)
    for stage, (patches, window) in enumerate([(64, 16), (16, 16)]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = vk.attention(model, x, layers=f"*.encoder.layers.{stage}.*")
        patterns = result.patterns
        assert patterns.shape == (2, 2, 2, patches, patches)
        assert result.layout.grid == ((8, 8) if stage == 0 else (4, 4))
        torch.testing.assert_close(patterns.sum(-1), torch.ones(patterns.shape[:-1]))
        # each query attends inside its one window of w² keys, zero elsewhere
        assert ((patterns > 0).sum(-1) <= window).all()


def test_swin_grid_off_the_windows_is_refused_clearly():
    """At 40 px the 10 x 10 grid is padded to 12 x 12 for 4 x 4 windows: the padded keys have
    no place on the image, so the maps are not put on the grid (they stay readable)."""
    model, x = build("swin"), torch.randn(2, 3, 40, 40)
    hm = vk.HookedModel(model)
    with torch.no_grad():
        plain = model(x).logits
    out, cache = hm.run_with_cache(x, names="*.hook_pattern")
    torch.testing.assert_close(out.logits, plain, atol=1e-5, rtol=0)
    assert cache["swin.encoder.layers.0.blocks.0.attention.hook_pattern"].shape == (18, 2, 16, 16)
    with pytest.raises(ValueError, match="not a multiple of the 4x4 windows"):
        vk.attention(model, x, layers="*.encoder.layers.0.*")


# -- analyses --------------------------------------------------------------------------------


def over_stages(method, model, x) -> list:
    """``method``'s default call on a model whose stages hold different tokens: `Stages`, one
    result per stage, from one forward."""
    result = method(model, x)
    assert isinstance(result, Stages), type(result).__name__
    return list(result)


@pytest.mark.parametrize("kind", ["swin", "swinv2"])
def test_analyses_on_swin(kind):
    model, x = build(kind, "eager" if kind == "swinv2" else "sdpa"), images()
    hm = vk.HookedModel(model)
    layout = hm.token_layout((32, 32))
    assert (layout.num_prefix_tokens, layout.grid, layout.class_token) == (0, (8, 8), False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights: flat maps
        stages = over_stages(vk.attention, model, x)  # two stages, two grids
        assert [s.patterns.shape for s in stages] == [(2, 4, 2, 64, 64), (2, 4, 2, 16, 16)]
        with pytest.raises(ValueError, match="hold different tokens"):
            vk.attention(model, x, layers=[1, 2])  # layers asked for must share their tokens
        assert vk.attention(model, x, layers=[2, 3]).patterns.shape == (2, 4, 2, 16, 16)
        rollout = vk.rollout(model, x)
        assert rollout.maps.shape == (4, 8, 8) and torch.isfinite(rollout.maps).all()
        cam = vk.gradcam(model, x)
        assert cam.maps.shape == (4, 4, 4)
        assert cam.options["layer"] == f"{kind}.encoder.layers.1.blocks.1.hook_resid_post"
        assert vk.cka_matrix(model, x, progress=False).matrix.shape == (4, 4)
        ratios = vk.residual_ratios(model, x)
        assert len(ratios.layers) == 4 and torch.isfinite(ratios.attn).all()
        stages = over_stages(vk.token_norms, model, x)
        assert [s.patches.shape for s in stages] == [(4, 2, 8, 8), (4, 2, 4, 4)]
        norms = vk.token_norms(model, x, layers=[2, 3])
        assert norms.patches.shape == (4, 2, 4, 4) and norms.prefix.shape == (4, 2, 0)
        with pytest.raises(ValueError, match="no class token"):
            vk.class_attention(model, x)
    assert implementations(model) == {"eager" if kind == "swinv2" else "sdpa"}


@pytest.mark.parametrize("kind", ["beit", "data2vec"])
@pytest.mark.parametrize("mean_pooling", [True, False])
def test_analyses_on_beit(kind, mean_pooling):
    model, x = build(kind, use_mean_pooling=mean_pooling), images()
    hm = vk.HookedModel(model)
    layout = hm.token_layout((32, 32))
    assert (layout.num_prefix_tokens, layout.grid, layout.class_token) == (1, (4, 4), True)
    assert hm.family.reads_class_token is (not mean_pooling)
    assert ("hook_final_norm" in " ".join(hm.hook_names())) is (not mean_pooling)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = vk.attention(model, x)
        assert result.patterns.shape == (2, 4, 2, 17, 17)
        torch.testing.assert_close(result.patterns.sum(-1), torch.ones(2, 4, 2, 17))
        for method in (vk.rollout, vk.class_attention):
            assert method(model, x).maps.shape == (4, 4, 4), method.__name__
        cam = vk.gradcam(model, x)
        assert cam.maps.shape == (4, 4, 4)
        assert cam.options["layer"].endswith(f"1.hook_resid_{'post' if mean_pooling else 'pre'}")
        assert vk.cka_matrix(model, x, progress=False).matrix.shape == (2, 2)
        ratios = vk.residual_ratios(model, x)
        assert len(ratios.layers) == 2 and ratios.has_layerscale == [True, True]
        norms = vk.token_norms(model, x)
        assert norms.patches.shape == (4, 2, 4, 4) and norms.prefix.shape == (4, 2, 1)
    first = model.get_submodule(ratios.layers[0])
    torch.testing.assert_close(vk.analysis.layerscale(model).attn[0], first.lambda_1.detach())


@pytest.mark.parametrize("kind", ["beit", "data2vec"])
def test_beit_without_layerscale(kind):
    """``layer_scale_init_value = 0``: BEiT's λ is the float 1.0, Data2Vec's None; both read as
    no LayerScale, and the ratios still run."""
    model, x = build(kind, layer_scale_init_value=0.0), images()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ratios = vk.residual_ratios(model, x)
    assert ratios.has_layerscale == [False, False]
    with pytest.raises(ValueError, match="no LayerScale"):
        vk.analysis.layerscale(model)
