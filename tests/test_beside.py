"""Attention maps computed beside the fused kernel (`vizkit.hooks.beside`): the same maps as the
explicit path, the fused kernel still computing the output, and the explicit path wherever a map
must be on the output's path."""

import pytest
import torch
import torch.nn.functional as F
from conftest import build

import vizkit as vk
from vizkit.hooks import beside

PATTERNS = "*attn.hook_pattern"


@pytest.fixture
def fused_calls(monkeypatch):
    """Count calls of the fused attention kernel."""
    calls = []
    kernel = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    return calls


def capture(hm, x, path, **options):
    with torch.no_grad():
        out, cache = hm.run_with_cache(x, names=PATTERNS, pattern_path=path, **options)
    return out, cache.stack("blocks.*.attn.hook_pattern")


def test_maps_beside_equal_the_unfused_maps_and_the_output_stays_fused(fused_calls):
    model, x = build("vit")
    hm = vk.HookedModel(model)
    with torch.no_grad():
        plain = model(x)
    fused_calls.clear()
    out_unfused, unfused = capture(hm, x, "unfused")
    assert not fused_calls  # the explicit path made the output
    out_beside, maps = capture(hm, x, "beside")
    assert len(fused_calls) == len(model.blocks)  # the fused kernel made the output
    assert torch.equal(out_beside, plain)
    torch.testing.assert_close(out_unfused, plain)
    # the first block sees the same input on both paths: the same operations, the same bits;
    # later blocks see the fused and the explicit path's slightly different outputs
    assert torch.equal(maps[0], unfused[0])
    torch.testing.assert_close(maps, unfused)
    assert all(b.attn.fused_attn for b in model.blocks)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_maps_beside_under_bfloat16_autocast_equal_the_unfused_maps():
    model, x = build("vit_reg_avg")
    hm = vk.HookedModel(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, unfused = capture(hm, x, "unfused")
        _, maps = capture(hm, x, "beside")
    assert maps.dtype == unfused.dtype  # CUDA's autocast runs softmax in float32, the CPU's not
    assert torch.equal(maps[0], unfused[0])
    torch.testing.assert_close(maps, unfused, atol=2e-2, rtol=0)  # bfloat16 block outputs


@pytest.mark.parametrize("causal", [False, True])
def test_maps_beside_apply_the_attention_mask(causal):
    model, x = build("vit")
    hm = vk.HookedModel(model)
    n = hm.token_layout(x.shape[-2:]).num_tokens
    mask = None if causal else torch.rand(n, n, generator=torch.Generator().manual_seed(0)) > 0.3
    if mask is not None:
        mask.fill_diagonal_(True)
    options = {"is_causal": True} if causal else {"attn_mask": mask}
    _, unfused = capture(hm, x, "unfused", **options)
    _, maps = capture(hm, x, "beside", **options)
    torch.testing.assert_close(maps, unfused)
    hidden = ~mask if mask is not None else torch.ones(n, n).triu(1).bool()
    assert (maps[:, :, :, hidden] == 0).all() and hidden.any()


def test_other_attention_modules_run_unfused_on_the_beside_path():
    model, x = build("cait")  # talking-heads attention: no beside path
    hm = vk.HookedModel(model)
    _, unfused = capture(hm, x, "unfused")
    _, maps = capture(hm, x, "beside")
    assert torch.equal(maps, unfused)  # every block unfused on both


def test_auto_is_unfused_on_a_cpu_and_beside_where_it_is_faster(monkeypatch, fused_calls):
    model, x = build("vit")
    expected = vk.attention(model, x).patterns
    assert not fused_calls
    monkeypatch.setattr(vk.hooks.hooked_model, "beside_is_faster", lambda model: True)
    got = vk.attention(model, x).patterns
    assert len(fused_calls) == len(model.blocks)
    torch.testing.assert_close(got, expected)
    fused_calls.clear()
    hm = vk.HookedModel(model)
    with torch.no_grad():
        hm.run_with_cache(x, names=PATTERNS, grads=False)
    assert len(fused_calls) == len(model.blocks)
    fused_calls.clear()
    hm.run_with_cache(x, names=PATTERNS, grads=True, target=0)  # gradients: on the path
    assert not fused_calls


def test_beside_is_faster_only_on_a_gpu_in_half_precision():
    model, _ = build("vit")
    assert not beside.beside_is_faster(model)
    assert not beside.beside_is_faster(model.to(torch.bfloat16))


def test_what_needs_the_map_on_the_output_path_is_refused_beside():
    model, x = build("vit")
    hm = vk.HookedModel(model)
    with pytest.raises(ValueError, match="no gradient; use pattern_path='auto' or 'unfused'"):
        hm.run_with_cache(x, names=PATTERNS, grads=True, pattern_path="beside")
    with pytest.raises(ValueError, match="pattern_path must be one of"):
        hm.run_with_cache(x, names=PATTERNS, pattern_path="fused")

    def edit(pattern, *, name):
        return pattern * 0

    with pytest.raises(ValueError, match=r"read-only run \(hooks\(read_only=True\)\)"):
        with torch.no_grad(), hm.hooks(fwd={"blocks.0.attn.hook_pattern": edit}, read_only=True):
            hm(x)
    assert all(b.attn.fused_attn for b in model.blocks)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_cached_values_take_the_chosen_dtype():
    model, x = build("vit")
    hm = vk.HookedModel(model)
    _, maps = capture(hm, x, "auto", dtype=torch.float16)
    _, full = capture(hm, x, "auto")
    assert maps.dtype == torch.float16 and full.dtype == torch.float32
    torch.testing.assert_close(maps.float(), full, atol=1e-3, rtol=0)
    _, cache = hm.run_with_cache(x, names="blocks.0.hook_resid_post", grads=True, dtype=torch.half)
    assert cache["blocks.0.hook_resid_post_grad"].dtype == torch.float16
    with pytest.raises(TypeError, match="floating torch.dtype"):
        hm.run_with_cache(x, names=PATTERNS, dtype=torch.int8)


def test_read_only_holds_with_backward_hooks_too():
    model, x = build("vit")
    hm = vk.HookedModel(model)

    def edit(t, *, name):
        return t * 2

    def read(g, *, name):
        return None

    fwd = {"blocks.0.hook_resid_post": edit}
    with pytest.raises(ValueError, match="read-only run"):
        with hm.hooks(fwd=fwd, bwd={"blocks.1.hook_resid_post": read}, read_only=True):
            hm(x).sum().backward()
    assert all(b.attn.fused_attn for b in model.blocks)
