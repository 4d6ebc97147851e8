"""Concept-conditional maps (`vizkit.concepts.conditioned_maps`): the units' maps and the rest
add up to the unconditioned map (channels and latents, each method), a channel's map against a
hand computation with plain torch hooks, the unconditioned AttnLRP map against vk.attnlrp, the
layer's relevance, the model left as it was, refusals."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from conftest import assert_full_state, full_state

import vizkit as vk
from vizkit.analysis.result import Result
from vizkit.concepts import CONDITIONED_METHODS, ConditionedMaps, conditioned_maps

LAYER = "blocks.0.hook_resid_post"


def _vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, depth=2,
                             embed_dim=16, num_heads=2, num_classes=3).eval()  # fmt: skip


def _images(count: int = 3) -> torch.Tensor:
    return torch.randn(count, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def _close_in_sum(parts: torch.Tensor, total: torch.Tensor) -> None:
    scale = total.abs().max().item()
    torch.testing.assert_close(parts, total, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("method", CONDITIONED_METHODS)
def test_channel_maps_and_the_rest_add_up_to_the_unconditioned_map(method):
    model, x = _vit(), _images()
    result = conditioned_maps(model, x, 1, LAYER, chosen=[0, 3, 7], method=method)
    assert result.maps.shape == (3, 3, 16, 16) and result.rest.shape == (3, 16, 16)
    assert result.units == [f"{LAYER} 0", f"{LAYER} 3", f"{LAYER} 7"]
    _close_in_sum(result.maps.sum(1) + result.rest, result.total)
    every = conditioned_maps(model, x, 1, LAYER, chosen=list(range(16)), method=method)
    _close_in_sum(every.maps.sum(1), every.total)
    assert every.rest.abs().max() <= 1e-6 * every.total.abs().max()
    assert result.relevance.shape == (3, 16) and result.classes.tolist() == [1, 1, 1]


def test_a_channel_map_equals_the_hand_computation():
    """x * d/dx (g_c a_c(x)) summed over channels and tokens, g the gradient at the layer held
    fixed: computed with a plain forward hook on timm's block 0."""
    model, x = _vit(), _images()
    result = conditioned_maps(model, x, 2, LAYER, chosen=[5], method="input_x_gradient")
    seen = {}
    handle = model.blocks[0].register_forward_hook(lambda m, i, o: seen.update(a=o))
    try:
        leaf = x.clone().requires_grad_(True)
        score = model(leaf)[:, 2].sum()
        (g,) = torch.autograd.grad(score, seen["a"], retain_graph=True)
        (grad,) = torch.autograd.grad((seen["a"][..., 5] * g[..., 5]).sum(), leaf)
    finally:
        handle.remove()
    expected = (x * grad).sum(1)
    torch.testing.assert_close(result.maps[:, 0], expected, rtol=1e-4, atol=1e-6)
    relevance = (seen["a"] * g).sum(1).detach()
    torch.testing.assert_close(result.relevance, relevance, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", CONDITIONED_METHODS)
def test_at_a_branch_the_units_maps_leave_out_what_goes_around_it(method):
    """At an MLP's hidden layer the skip connection carries relevance around the neurons: in
    no neuron's map, all in the rest. Every neuron's map summed is the total less the map with
    the layer's gradient cut (a plain forward hook returning its output detached); with every
    neuron chosen, the rest is that map."""
    model, x = _vit(), _images()
    hidden = "blocks.1.mlp.act.hook_out"
    every = conditioned_maps(model, x, 1, hidden, chosen=list(range(64)), method=method)
    handle = model.blocks[1].mlp.act.register_forward_hook(lambda m, i, o: o.detach())
    try:
        around = conditioned_maps(model, x, 1, LAYER, chosen=[0], method=method).total
    finally:
        handle.remove()
    _close_in_sum(every.maps.sum(1), every.total - around)
    _close_in_sum(every.rest, around)
    assert around.abs().max() > 0.1 * every.total.abs().max()  # the skip path carries some
    some = conditioned_maps(model, x, 1, hidden, chosen=[2, 9], method=method)
    _close_in_sum(some.maps.sum(1) + some.rest, some.total)


def test_the_unconditioned_attnlrp_map_is_vk_attnlrps():
    model, x = _vit(), _images()
    result = conditioned_maps(model, x, None, LAYER, method="attnlrp")
    reference = vk.attnlrp(model, x, None).extras["relevance"].sum(1)
    torch.testing.assert_close(result.total, reference, rtol=1e-5, atol=1e-6)
    # chosen=None: the 8 units of highest relevance summed over the images
    assert len(result.units) == 8
    top = result.relevance.sum(0).topk(8).indices.tolist()
    assert result.options["chosen"] == top


def test_latent_maps_and_the_rest_add_up(shapes_sae):
    model, sae = shapes_sae
    x = vk.datasets.load_sample()[0][:4]
    result = conditioned_maps(model, x, None, sae, chosen=[0, 1, 2], method="attnlrp")
    assert result.units == ["latent 0", "latent 1", "latent 2"]
    assert result.relevance.shape == (4, sae.latents) and result.options["units"] == "sae"
    _close_in_sum(result.maps.sum(1) + result.rest, result.total)
    plain = conditioned_maps(model, x, None, sae, chosen=[0, 1, 2], method="input_x_gradient")
    _close_in_sum(plain.maps.sum(1) + plain.rest, plain.total)


def test_a_swin_stages_map_is_read_where_its_layout_is_a_view():
    """A Swin block's output is an NHWC map (B, H, W, C), its tokens a view of it: the layer's
    relevance is (a g) summed over the positions, a and g read with a plain hook on timm's
    block, and the channels' maps add up to the whole (the relevance once missed the layer)."""
    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", img_size=56, embed_dim=16,
                              depths=(1, 1), num_heads=(2, 2), num_classes=3).eval()  # fmt: skip
    x = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(1))
    layer = "layers.0.blocks.0.hook_resid_post"
    result = conditioned_maps(model, x, 1, layer, chosen=list(range(16)), method="input_x_gradient")
    seen = {}
    handle = model.layers[0].blocks[0].register_forward_hook(lambda m, i, o: seen.update(a=o))
    try:
        (g,) = torch.autograd.grad(model(x)[:, 1].sum(), seen["a"])
    finally:
        handle.remove()
    relevance = (seen["a"] * g).sum((1, 2)).detach()  # (B, C)
    assert relevance.abs().max() > 0
    torch.testing.assert_close(result.relevance, relevance, rtol=1e-4, atol=1e-6)
    _close_in_sum(result.maps.sum(1), result.total)
    assert result.maps.shape == (2, 16, 56, 56)


def test_the_model_is_left_as_it_was_and_refusals():
    model, x = _vit(), _images()
    model.train()
    before = full_state(model)
    result = conditioned_maps(model, x, 0, LAYER, chosen=[1])
    assert_full_state(model, before)
    with pytest.raises(ValueError, match="method must be one of"):
        conditioned_maps(model, x, 0, LAYER, method="gradcam")
    with pytest.raises(ValueError, match=r"distinct unit indices in \[0, 16\)"):
        conditioned_maps(model, x, 0, LAYER, chosen=[16])
    with pytest.raises(ValueError, match="distinct"):
        conditioned_maps(model, x, 0, LAYER, chosen=[1, 1])
    with pytest.raises(ValueError, match="not a token stream"):
        conditioned_maps(model, x, 0, "blocks.0.attn.hook_pattern")
    with pytest.raises(TypeError, match="hook name or a SparseAutoencoder"):
        conditioned_maps(model, x, 0, 3)
    assert_full_state(model, before)
    back = Result.from_dict(json.loads(json.dumps(result.to_dict(), allow_nan=False)))
    assert isinstance(back, ConditionedMaps) and torch.equal(back.maps, result.maps)


def test_the_figure_shows_the_total_each_unit_and_the_rest_on_one_signed_axis():
    model, x = _vit(), _images(2)
    result = conditioned_maps(model, x, 1, LAYER, chosen=[2, 4], method="input_x_gradient")
    shown = vk.viz.display_images(x, model)
    fig = vk.viz.conditioned_maps_figure(result, shown, {4: "stripes (IoU 0.30)"})
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:4] == ["all units", "channel 2", "stripes<br>channel 4", "the rest"]
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert len(heat) == 2 * 4
    torch.testing.assert_close(torch.tensor(heat[2].z, dtype=torch.float32), result.maps[0, 1])
    largest = max(result.total.abs().max(), result.maps.abs().max(), result.rest.abs().max())
    assert fig.layout.coloraxis.cmax == pytest.approx(float(largest))
    assert fig.layout.coloraxis.cmin == -fig.layout.coloraxis.cmax


def test_each_column_on_its_own_scale_shows_its_range():
    model, x = _vit(), _images(2)
    result = conditioned_maps(model, x, 1, LAYER, chosen=[2, 4], method="input_x_gradient")
    shown = vk.viz.display_images(x, model)
    fig = vk.viz.conditioned_maps_figure(result, shown, scale="each")
    panels = [result.total, result.maps[:, 0], result.maps[:, 1], result.rest]
    bottom = [fig.layout[f"xaxis{n}"].title.text for n in range(5, 9)]  # the second row's
    for c, panel in enumerate(panels):
        axis = fig.layout[f"coloraxis{c + 1 if c else ''}"]
        top = float(panel[:2].abs().max())
        assert axis.cmax == pytest.approx(top) and axis.cmin == -axis.cmax
        assert bottom[c] == f"±{top:.2g}"
        assert axis.showscale == (c == 0)
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert [t.coloraxis for t in heat[:4]] == ["coloraxis", "coloraxis2", "coloraxis3",
                                               "coloraxis4"]  # fmt: skip
    with pytest.raises(ValueError, match="'shared' or 'each'"):
        vk.viz.conditioned_maps_figure(result, shown, scale="own")
