"""One vocabulary: every public analysis takes ``layers=``/``layer=`` as an int, a negative int, a
hook name or a module path (and ``heads=`` where heads are fused), and the spellings agree."""

from __future__ import annotations

import pytest
import torch
from conftest import build

import vizkit as vk
from vizkit.papers import refiner

DEPTH = 4  # vizkit_refined_vit_tiny below; test_vit has 6 blocks
IMAGES = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))


def _vit():
    return build("vit")


def _cait():
    return build("cait")


def _refined():
    torch.manual_seed(0)
    model = vk.create_model("vizkit_refined_vit_tiny", depth=DEPTH, embed_dim=32, img_size=32)
    return model.eval(), IMAGES[..., :32, :32]


def _attention(model, x, spec):
    result = vk.attention(model, x, layers=spec)
    return result.patterns, (result.names, result.layers)


def _class_attention(model, x, spec):
    result = vk.class_attention(model, x, layer=spec)
    return result.maps, (result.options["layer"], result.options["layer_index"])


def _gradcam(model, x, spec):
    result = vk.gradcam(model, x, target=0, layer=spec)
    return result.maps, (result.options["layer"], result.options["layer_index"])


def _cka(model, x, spec):
    result = vk.cka_matrix(model, x, layers=spec, unbiased=False, progress=False)
    return result.matrix, (result.layers_a, result.indices_a)


def _evolution(model, x, spec):
    result = vk.feature_evolution(model, x, layers=spec, unbiased=False, progress=False)
    return result.curve, (result.layers, result.cka.indices_a)


def _stage_layers(model, x, spec):
    return torch.tensor(vk.analysis.stage_layers(model, tuple(x.shape[-2:]), layer=spec)), ()


def _refiner_stages(model, x, spec):
    stages = refiner.refiner_stages(model, x, layer=spec)
    return stages.maps["refined"], (stages.layer, stages.name)


def _query_attention(model, x, spec):
    fig = vk.viz.query_attention(vk.attention(model, x), vk.viz.display_images(x), layer=spec)
    return torch.tensor(fig.data[-1].z), (fig.layout.title.text,)


def _attention_matrices(model, x, spec):
    results = {"softmax": vk.attention(model, x)}
    fig = refiner.attention_matrices(results, layers=spec if isinstance(spec, list) else [spec])
    return torch.tensor(fig.data[0].z), (fig.layout.annotations[0].text,)


# analysis -> (model, spellings of one choice: int, negative int, hook name, module path, ...)
CASES = {
    "attention": (_vit, _attention, [2, -4, "blocks.2.attn.hook_pattern", "blocks.2"]),
    "attention-list": (
        _vit,
        _attention,
        [[0, 3], [-6, -3], ["blocks.0.attn.hook_pattern", "blocks.3"], "blocks.[03].attn.*n"],
    ),
    "attention-applied-name": (
        _refined,
        _attention,
        [1, -3, "blocks.1.attn.hook_pattern_refined", "blocks.-3"],
    ),
    "class_attention": (
        _cait,
        _class_attention,
        [1, -1, "blocks_token_only.1.attn.hook_pattern", "blocks_token_only.1"],
    ),
    "gradcam": (_vit, _gradcam, [2, -4, "blocks.2.hook_resid_pre", "blocks.2", "blocks.-4"]),
    "cka_matrix": (
        _vit,
        _cka,
        [[0, 2], [-6, -4], ["blocks.0.hook_resid_post", "blocks.2"], "blocks.[02].hook_resid_pos?"],
    ),
    "feature_evolution": (_vit, _evolution, [[1, 3], [-5, -3], ["blocks.1", "blocks.-3"]]),
    "stage_layers": (_vit, _stage_layers, [3, -3, "blocks.3.attn.hook_pattern", "blocks.3"]),
    "refiner_stages": (
        _refined,
        _refiner_stages,
        [2, -2, "blocks.2.attn.hook_pattern_refined", "blocks.2"],
    ),
    "viz.query_attention": (
        _vit,
        _query_attention,
        [1, -5, "blocks.1.attn.hook_pattern", "blocks.1"],
    ),
    "refiner.attention_matrices": (
        _vit,
        _attention_matrices,
        [2, -4, "blocks.2.attn.hook_pattern", "blocks.2"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_spelling_of_a_layer_gives_the_same_answer(case):
    make, call, spellings = CASES[case]
    model, x = make()
    values, resolved = zip(*(call(model, x, spec) for spec in spellings), strict=True)
    for spec, value, names in zip(spellings[1:], values[1:], resolved[1:], strict=True):
        torch.testing.assert_close(value, values[0], rtol=0, atol=0, msg=f"{case}: {spec!r}")
        assert names == resolved[0], f"{case}: {spec!r} resolved to {names}, not {resolved[0]}"


def test_results_carry_resolved_names_and_indices():
    model, x = _vit()
    assert vk.attention(model, x, layers=["blocks.1", -1]).layers == [1, 5]
    assert vk.gradcam(model, x, layer="blocks.1").options == {
        "layer": "blocks.1.hook_resid_pre",
        "layer_index": 1,
    }
    other = vk.gradcam(model, x, layer="blocks.1.hook_resid_mid")
    assert other.options["layer_index"] is None  # not one of the counted layers
    cka = vk.cka_matrix(
        model, x, layers=[-1, "blocks.1.hook_resid_mid"], unbiased=False, progress=False
    )
    assert cka.layers_a == ["blocks.5.hook_resid_post", "blocks.1.hook_resid_mid"]
    assert cka.indices_a == [5, None]


HEAD_CASES = {
    "rollout": lambda model, x, heads: vk.rollout(model, x, heads=heads).maps,
    "class_attention": lambda model, x, heads: vk.class_attention(model, x, heads=heads).maps,
    "AttentionResult.heads": lambda model, x, heads: vk.attention(model, x).heads(heads),
    "AttentionResult.row": lambda model, x, heads: vk.attention(model, x).row("cls", heads),
    "AttentionResult.received": lambda model, x, heads: vk.attention(model, x).received(heads),
    "viz.query_attention": lambda model, x, heads: torch.tensor(
        vk.viz.query_attention(vk.attention(model, x), vk.viz.display_images(x), heads=heads)
        .data[-1]
        .z
    ),
}


@pytest.mark.parametrize("case", list(HEAD_CASES))
def test_every_spelling_of_heads_agrees(case):
    model, x = _vit()
    call = HEAD_CASES[case]
    count = model.blocks[0].attn.num_heads
    assert count > 1
    torch.testing.assert_close(call(model, x, 1), call(model, x, 1 - count))
    torch.testing.assert_close(call(model, x, [1]), call(model, x, 1))
    torch.testing.assert_close(call(model, x, list(range(count))), call(model, x, "mean"))
    assert not torch.equal(call(model, x, "max"), call(model, x, "mean"))


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        (6, ValueError, r"index 6 does not exist; the model has 6 self-attention layers"),
        ([], ValueError, "layers is empty"),
        (1.5, TypeError, "layers must be an int"),
        ([0, None], TypeError, "got None"),
        ("blocks.9", KeyError, "none of the 6 self-attention layers"),
        ("blocks.2.hook_resid_pre", KeyError, "none of the 6 self-attention layers"),
        ("blocks.*.mlp*", KeyError, "matches"),
    ],
)
def test_bad_layers_say_what_is_valid(spec, error, match):
    model, x = _vit()
    with pytest.raises(error, match=match):
        vk.attention(model, x, layers=spec)


def test_one_layer_refuses_several():
    model, x = _vit()
    with pytest.raises(ValueError, match="selects 6 Grad-CAM layers"):
        vk.gradcam(model, x, layer="blocks.*.hook_resid_pre")


def test_each_layer_is_selected_once_and_globs_keep_forward_order():
    model, x = _cait()  # talking heads: a softmax and a mixed map per block
    assert vk.attention(model, x, layers="blocks.*").layers == [0, 1]
    vit, y = _vit()
    both = ["blocks.2.attn.hook_pattern", "blocks.*.attn.hook_pattern"]
    assert vk.attention(vit, y, layers=both).layers == [2, 0, 1, 3, 4, 5]
    assert vk.attention(vit, y, layers=[1, 1, -5]).layers == [1]
    other = vk.create_model("test_vit").eval()
    result = vk.cka_matrix(vit, y, layers=[1, "blocks.1"], model_b=other, layers_b=[0, 0],
                           unbiased=False, progress=False)  # fmt: skip
    assert result.matrix.shape == (1, 1)


def test_a_result_names_layers_as_the_model_does():
    model, x = _refined()
    some = vk.attention(model, x, layers=[0, 2])
    assert some.position("blocks.-2") == 1  # blocks.2 of the model, not the second captured
    with pytest.raises(ValueError, match=r"Layer 3 \(blocks.3.attn.hook_pattern\) was not"):
        some.position("blocks.-1")
    with pytest.raises(ValueError, match="Layer 3 .* was not captured"):
        some.position(-1)
    assert some.position("blocks.2.attn.hook_pattern_refined") == 1  # applied name, same layer
    assert vk.attention(model, x, layers=[2, 0]).position() == 0  # the deepest captured


def test_stage_paths_and_head_counts_of_a_hierarchical_model():
    swin = vk.create_model(
        "swin_tiny_patch4_window7_224", img_size=64, window_size=4, embed_dim=24,
        depths=(1, 1, 2, 1), num_heads=(1, 2, 3, 4),
    ).eval()  # fmt: skip
    x = torch.randn(1, 3, 64, 64)
    assert vk.analysis.stage_layers(swin, (64, 64), layer="layers.2") == [2, 3]
    assert vk.analysis.stage_layers(swin, (64, 64)) == [4]
    with pytest.raises(ValueError, match="head 1 does not exist in a map with 1 heads"):
        vk.rollout(swin, x, heads=1)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m, x: vk.rollout(m, x, heads=[]), ValueError, "non-empty list"),
        (lambda m, x: vk.attention(m, x, layers="blocks.-0"), KeyError, "matches none"),
        (lambda m, x: vk.attention(m, x, layers="blocks.9*"), KeyError, "none of the 6 self"),
        (lambda m, x: vk.gradcam(m, x, layer="blocks.9"), KeyError, "none of the 6 Grad-CAM"),
    ],
)
def test_messages_count_the_layers_ints_count(call, error, match):
    with pytest.raises(error, match=match):
        call(*_vit())
