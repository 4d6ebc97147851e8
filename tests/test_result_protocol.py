"""Every result class: options, token layout and input size; a JSON round trip through
``to_dict``/``from_dict``; a compact repr; HTML for tabular results."""

from __future__ import annotations

import functools
import json
import math
import tempfile

import pytest
import timm
import torch
from conftest import build

import vizkit as vk
from vizkit.analysis.result import Result
from vizkit.circuits.feature_circuit import feature_circuit, feature_faithfulness
from vizkit.circuits.feature_edges import feature_edges
from vizkit.circuits.feature_patching import exact_feature_patching, feature_agreement
from vizkit.concepts import (
    PatchLabels,
    check_names,
    clip_dissect,
    conditioned_maps,
    craft,
    dissect,
    patch_labels,
    probe_units,
    shapes_concepts,
    tcav,
)
from vizkit.datasets.captions import WordTokenizer
from vizkit.hooks import TokenLayout
from vizkit.models.text_image import clip_shapes
from vizkit.papers import cait, masks, refiner, sot
from vizkit.registers.planted import bright_patch_images, planted_register_vit


def _refined():
    torch.manual_seed(0)
    model = vk.create_model("vizkit_refined_vit_tiny", depth=2, embed_dim=32, img_size=32)
    return model.eval(), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _sot():
    torch.manual_seed(0)
    return vk.create_model("vizkit_sot_micro").eval(), torch.randn(2, 3, 32, 32)


def _gaussian_fit():
    grid = (4, 4)
    d2 = masks.grid_square_distances(grid, torch.device("cpu"))
    return masks.fit_gaussian_mixture(torch.exp(-d2 / 2), grid, num_kernels=1, restarts=1)


@functools.cache
def _clip_split():
    """The tiny text-image model, its decomposition of four images and a TextSpan of them."""
    tokenizer = WordTokenizer()
    torch.manual_seed(0)
    model = clip_shapes(tokenizer.vocab_size, tokenizer.context_length, layers=1).eval()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    split = vk.embedding_decomposition(model, x, tokens=-1)
    span = vk.text_span(model, split, ["a circle", "a red star", "a ring"], tokenizer, basis=2)
    return model, x, split, span


def vit_and_images(count: int) -> tuple:
    """The ViT with a planted register neuron and ``count`` images that trigger it."""
    return planted_register_vit(), bright_patch_images(count)[0]


def _curve():
    model, x = build("vit")
    return vk.metrics.deletion(model, x, vk.gradcam(model, x), steps=4)


# class name -> (a real result of it, whether it was computed from an input batch)
def _late_class_token():
    """ConViT, whose class token joins at layer 2: its default attention has two stages."""
    torch.manual_seed(0)
    model = timm.create_model(
        "convit_tiny", img_size=64, depth=3, local_up_to_layer=2, embed_dim=48, num_heads=4
    )
    return model.eval(), torch.randn(2, 3, 64, 64)


def _evaluation_inputs():
    model, x = build("vit")
    return model, (x, torch.tensor([0, 1]))


EXAMPLES = {
    "AttentionResult": (lambda: vk.attention(*build("vit"), layers=[0, -1]), True),
    "Stages": (lambda: vk.attention(*_late_class_token()), True),
    "SaliencyResult": (lambda: vk.gradcam(*build("vit")), True),
    "CKAResult": (
        lambda: vk.cka_matrix(*build("vit"), layers=[0, 1], unbiased=False, progress=False),
        True,
    ),
    "FeatureEvolution": (
        lambda: vk.feature_evolution(*build("vit"), unbiased=False, progress=False),
        True,
    ),
    "ResidualRatios": (lambda: vk.residual_ratios(*build("cait")), True),
    "TokenNorms": (lambda: vk.token_norms(*build("vit")), True),
    "TokenPCA": (lambda: vk.token_pca(*build("vit"), components=2), True),
    "GammaStats": (lambda: vk.residual_ratios(*build("cait")).gamma_attn, False),
    "CurveResult": (_curve, True),
    "SaliencyTable": (
        lambda: vk.compare_saliency(*build("vit"), methods=("gradcam", "random"), steps=4),
        True,
    ),
    "RefinerStages": (lambda: refiner.refiner_stages(*_refined(), layer=-1), True),
    "HeadAnatomy": (lambda: sot.head_anatomy(*_sot()), True),
    "BranchPredictions": (
        lambda: sot.branch_predictions(
            _sot()[0],
            torch.utils.data.TensorDataset(torch.randn(5, 3, 32, 32), torch.arange(5)),
            batch_size=2,
        ),
        True,
    ),
    "MaskLocality": (lambda: masks.mask_locality(torch.randn(3, 16, 16), (4, 4)), False),
    "GaussianFit": (_gaussian_fit, False),
    "CaitFamilyRow": (lambda: cait.cait_family_table(["cait_xxs24_224"])[0], False),
    "LayerScale": (lambda: vk.analysis.layerscale(build("cait")[0]), False),
    "TalkingHeadsMixing": (lambda: cait.talking_heads(build("cait")[0]), False),
    "SaliencyTable over data": (
        lambda: vk.evaluate(
            *_evaluation_inputs(), methods=["random"], metrics=["sparseness"], progress=False
        ),
        False,
    ),
    "Predictions": (
        lambda: vk.metrics.predictions(torch.randn(3, 5), torch.tensor([0, 4, 2]), list("abcde")),
        False,
    ),
    "SanityResult": (
        lambda: vk.metrics.sanity_check(*build("vit"), "saliency", progress=False),
        False,
    ),
    "LogitAttribution": (lambda: vk.direct_logit_attribution(*build("vit"), versus=0), True),
    "LogitLens": (lambda: vk.logit_lens(*build("vit")), True),
    "PatchingResult": (
        lambda: vk.activation_patching(*build("vit"), build("vit")[1].flip(0), progress=False),
        True,
    ),
    "AblationResult": (
        lambda: vk.ablation(*build("vit"), "mlp", labels=torch.tensor([0, 1]), progress=False),
        True,
    ),
    "EmbeddingDecomposition": (lambda: _clip_split()[2], True),
    "TextSpan": (lambda: _clip_split()[3], True),
    "MeanAblation": (
        lambda: vk.text.mean_ablation(_clip_split()[2], torch.randn(3, 64), [0, 1, 2, 0]),
        True,
    ),
    "LabelShares": (lambda: vk.text.label_shares(_clip_split()[2], {"x": "abab"}), True),
    "RegisterNeurons": (
        lambda: vk.registers.register_neurons(
            planted_register_vit(), bright_patch_images(4)[0], progress=False
        ),
        True,
    ),
    "RegisterEffect": (
        lambda: vk.registers.register_effect(
            planted_register_vit(), bright_patch_images(2)[0], {1: [7]}, steps=2
        ),
        True,
    ),
    "TextMap": (
        lambda: vk.text.fit_text_map(_clip_split()[0], _clip_split()[0], torch.randn(6, 3, 32, 32)),
        False,
    ),
}


def _planted_attribution():
    model = vk.circuits.planted_circuit_vit()
    x, labels, flipped = vk.circuits.planted_images(4)
    scored = vk.attribution_patching(model, x, flipped, target=labels, progress=False)
    return model, x, flipped, scored


def _planted_faithfulness():
    model, x, flipped, scored = _planted_attribution()
    return vk.circuits.faithfulness(model, scored, x, flipped, progress=False)


def _planted_agreement():
    model, x, flipped, scored = _planted_attribution()
    exact = vk.circuits.exact_patching(model, x, flipped, target=scored.targets, progress=False)
    return vk.circuits.agreement(scored, exact)


def _vit_pair():
    model, x = build("vit")
    return model, x, x.flip(0)


def _attribution_with_qkv():
    return vk.attribution_patching(*_vit_pair(), qkv=True, progress=False)


def _feature_attribution():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    x = vk.datasets.load_sample()[0][:8]
    store = vk.cache_activations(model, x, tempfile.mkdtemp() + "/s", layers=[-2],
                                 tokens="all", progress=False)  # fmt: skip
    sae = vk.train_sae(store, expansion=2, k=8, tokens=2 * len(store), batch_size=256,
                       progress=False)  # fmt: skip
    return vk.circuits.feature_attribution(model, x[:2], x[:2].flip(0), sae, progress=False)


@functools.cache
def _feature_nodes():
    """The Shapes ViT, two image pairs, autoencoders on blocks 1 and 2, and their nodes."""
    model, _ = vk.zoo.load("vit_tiny_shapes")
    x = vk.datasets.load_sample()[0][:8]
    saes = []
    for layer in (-3, -2):
        store = vk.cache_activations(model, x, tempfile.mkdtemp() + "/s", layers=[layer],
                                     tokens="all", progress=False)  # fmt: skip
        saes.append(vk.train_sae(store, expansion=2, k=8, tokens=2 * len(store),
                                 batch_size=256, progress=False))  # fmt: skip
    clean, corrupted = x[:2], x[:2].flip(0)
    nodes = vk.circuits.feature_attribution(model, clean, corrupted, saes, progress=False)
    return model, clean, corrupted, saes, nodes


def _feature_edges():
    model, clean, corrupted, saes, _ = _feature_nodes()
    return feature_edges(model, clean, corrupted, saes, k=3, progress=False)


def _feature_circuit():
    return feature_circuit(_feature_nodes()[-1], 4)


def _feature_faithfulness():
    model, clean, corrupted, saes, nodes = _feature_nodes()
    return feature_faithfulness(model, nodes, clean, corrupted, saes, progress=False)


def _exact_feature_patching():
    model, clean, corrupted, saes, _ = _feature_nodes()
    return exact_feature_patching(model, clean, corrupted, saes, latents=[[0, 1], None],
                                  progress=False)  # fmt: skip


def _feature_agreement():
    return feature_agreement(_feature_nodes()[-1], _exact_feature_patching())


CIRCUIT_EXAMPLES = {
    "FeatureAttribution": (_feature_attribution, False),
    "AttributionResult": (lambda: vk.attribution_patching(*_vit_pair(), progress=False), True),
    "AttributionResult with qkv": (_attribution_with_qkv, True),
    "Circuit": (lambda: vk.circuits.circuit(_planted_attribution()[3], 3), False),
    "FaithfulnessCurve": (_planted_faithfulness, False),
    "Agreement": (_planted_agreement, False),
    "CorruptionEffect": (lambda: vk.circuits.corruption_effect(*_vit_pair()), False),
    "FeatureEdges": (_feature_edges, False),
    "FeatureCircuit": (_feature_circuit, False),
    "FaithfulnessCurve of latents": (_feature_faithfulness, False),
    "FeatureAttribution exact": (_exact_feature_patching, False),
    "Agreement of latents": (_feature_agreement, False),
}
EXAMPLES.update(CIRCUIT_EXAMPLES)


def _dissection():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images, concepts = shapes_concepts(20)
    return dissect(model, images, concepts, "blocks.3.hook_resid_post", progress=False)


EXAMPLES["Dissection"] = (_dissection, True)


def _clip_dissection():
    model, card = vk.zoo.load("vit_tiny_shapes")
    images = vk.datasets.load_sample()[0][:20]
    image_text = torch.rand(
        len(images), len(card["classes"]), generator=torch.Generator().manual_seed(0)
    )
    return clip_dissect(model, images, card["classes"], "blocks.3.hook_resid_post",
                        image_text=image_text, progress=False)  # fmt: skip


EXAMPLES["CLIPDissection"] = (_clip_dissection, True)


def _named_units():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images, concepts = shapes_concepts(12, seed=5)
    return check_names(model, _dissection(), images, concepts, progress=False)


EXAMPLES["NamedUnits"] = (_named_units, False)


def _probes():
    model, card = vk.zoo.load("vit_tiny_shapes")
    data = vk.datasets.Shapes("test", n=16, seed=3)
    images = torch.stack([data[i][0] for i in range(16)])
    pixels = torch.where(data.masks, data.labels[:, None, None].long(), 10)
    labels = patch_labels(pixels, (8, 8), [*card["classes"], "background"])
    train = PatchLabels(labels.classes, labels.labels[:8])
    test = PatchLabels(labels.classes, labels.labels[8:])
    layer = "blocks.3.hook_resid_post"
    return probe_units(model, layer, images[:8], train, images[8:], test, steps=5, progress=False)


EXAMPLES["Probes"] = (_probes, False)


def _conditioned_maps():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images = vk.datasets.load_sample()[0][:2]
    return conditioned_maps(model, images, None, "blocks.2.hook_resid_post", chosen=[0, 5])


EXAMPLES["ConditionedMaps"] = (_conditioned_maps, True)


def _tcav():
    model, card = vk.zoo.load("vit_tiny_shapes")
    images, labels = vk.datasets.load_sample()[:2]
    circle = card["classes"].index("circle")
    concept, others = images[labels == circle], images[labels != circle]
    return tcav(model, images[:8], circle, "blocks.3.hook_resid_post", concept[:6],
                list(others[:24].chunk(3)))  # fmt: skip


EXAMPLES["TCAVResult"] = (_tcav, True)


def _craft():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images, labels, _ = vk.datasets.load_sample()
    return craft(model, images[labels == 0][:4], 0, "blocks.2.hook_resid_post", concepts=3,
                 designs=4, progress=False)  # fmt: skip


EXAMPLES["Craft"] = (_craft, True)


def test_every_result_class_has_an_example():
    assert set(Result.registry) - {"TokenLayout"} == {_class(name) for name in EXAMPLES}


@pytest.fixture(params=list(EXAMPLES), scope="module")
def example(request):
    make, from_input = EXAMPLES[request.param]
    return request.param, make(), from_input


def _class(example: str) -> str:
    """The result class an example of ``EXAMPLES`` is of: its name up to a space."""
    return example.split(" ")[0]


def test_round_trip_through_json_gives_an_equal_result(example):
    name, result, _ = example
    data = json.dumps(result.to_dict(), allow_nan=False)  # strict JSON: NaN as strings
    back = Result.from_dict(json.loads(data))
    assert type(back).__name__ == _class(name)
    assert json.dumps(back.to_dict()) == data  # every field, tensors with dtype and shape
    assert type(back).from_dict(json.loads(data)).to_dict() == back.to_dict()


def test_tensors_come_back_bit_identical_with_their_dtype():
    result = vk.attention(*build("vit"), layers=-1)
    back = vk.AttentionResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back.patterns.dtype == result.patterns.dtype
    assert torch.equal(back.patterns, result.patterns)
    assert back.layout == result.layout and back.image_size == result.image_size == (64, 64)
    assert back.row((1, 2)).equal(result.row((1, 2)))  # methods work on the rebuilt result


def test_results_state_options_layout_and_input_size(example):
    name, result, from_input = example
    assert isinstance(result.options, dict)
    assert result.layout is None or isinstance(result.layout, TokenLayout)
    if from_input:
        assert result.image_size in ((64, 64), (32, 32)), name
    else:
        assert result.image_size is None and result.layout is None


def test_repr_is_one_short_line(example):
    name, result, _ = example
    text = repr(result)
    assert text.startswith(_class(name) + "(") and "\n" not in text and len(text) < 600, text
    assert "tensor(" not in text  # tensors by shape and dtype, not values


def test_tabular_results_render_html(example):
    name, result, _ = example
    page = result._repr_html_()
    tabular = {"CKAResult", "FeatureEvolution", "ResidualRatios", "CurveResult", "SaliencyTable",
               "BranchPredictions", "CaitFamilyRow", "SaliencyTable over data"}  # fmt: skip
    assert (page is not None and "<table" in page) == (name in tabular), name


def test_from_dict_refuses_another_class_and_unknown_types():
    data = vk.gradcam(*build("vit")).to_dict()
    with pytest.raises(TypeError, match="CKAResult.from_dict got a SaliencyResult"):
        vk.CKAResult.from_dict(data)
    with pytest.raises(ValueError, match="Unknown result type 'Nothing'"):
        Result.from_dict({**data, "__type__": "Nothing"})
    with pytest.raises(ValueError, match="no '__type__' tag"):  # e.g. an old history entry
        vk.ResidualRatios.from_dict({"layers": ["blocks.0"], "attn": [0.1]})


def test_non_finite_values_and_option_types_survive_strict_json():
    with pytest.warns(UserWarning, match="rollout skipped"):
        table = vk.compare_saliency(*build("cait"), methods=("rollout", "random"), steps=4)
    assert table.mean.isnan().any()  # rollout is skipped for CaiT's talking heads
    back = Result.from_dict(json.loads(json.dumps(table.to_dict(), allow_nan=False)))
    assert torch.equal(back.mean.isnan(), table.mean.isnan())
    assert all(
        math.isnan(s) for s, r in zip(back.seconds, table.seconds, strict=True) if math.isnan(r)
    )
    rolled = vk.rollout(*build("vit"), heads=range(2))
    assert rolled.options["heads"] == [0, 1]
    options = Result.from_dict(json.loads(json.dumps(rolled.to_dict())))
    assert options.options["heads"] == [0, 1]
