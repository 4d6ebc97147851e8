"""TCAV (Kim et al. 2018, "Interpretability Beyond Feature Attribution: Quantitative Testing
with Concept Activation Vectors (TCAV)"): the CAV against a classifier fitted by hand, the
scores against captum's on the same CAV, a planted concept whose sensitivity is known in closed
form, a transformers backbone's sensitivities against finite differences, the model left as it
was, the JSON round trip and the refusals."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import timm
import torch
from conftest import assert_full_state, full_state
from sklearn.linear_model import SGDClassifier
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import vizkit as vk
from vizkit.analysis.result import Result
from vizkit.concepts.tcav import (
    CAV,
    TCAVResult,
    concept_activation_vector,
    concept_sensitivity,
    held_out_split,
    tcav,
)

LAYER = "blocks.1.hook_resid_post"  # the output of timm's module blocks.1: (B, 17, 16)


def tiny_vit(**kwargs) -> nn.Module:
    """A seeded two-block timm ViT on 16 px images (patches of 4, width 16, 3 classes)."""
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, depth=2,
                             embed_dim=16, num_heads=2, num_classes=3, **kwargs).eval()  # fmt: skip


def noise(count: int, seed: int, size: int = 16) -> torch.Tensor:
    """(count, 3, size, size) seeded standard normal images."""
    return torch.randn(count, 3, size, size, generator=torch.Generator().manual_seed(seed))


def bright(count: int, seed: int, amplitude: float = 3) -> torch.Tensor:
    """Noise images whose top-left quadrant is brighter by ``amplitude`` in channel 0: the
    concept."""
    images = noise(count, seed)
    images[:, 0, :8, :8] += amplitude
    return images


def test_scores_equal_captums_on_the_same_cav(tmp_path):
    from captum.concept import TCAV, Concept
    from captum.concept._core.cav import CAV as CaptumCAV

    model, x = tiny_vit(), noise(16, 1)
    concept, randoms = bright(12, 2), [noise(12, 3), noise(12, 4)]
    seen = {}
    handle = model.blocks[1].register_forward_hook(lambda m, a, out: seen.setdefault("out", out))
    try:
        with torch.no_grad():
            _, cache = vk.HookedModel(model).run_with_cache(x, [LAYER])
    finally:
        handle.remove()
    assert torch.equal(cache[LAYER], seen["out"])  # the hook name is captum's layer "blocks.1"

    result = tcav(model, x, 2, LAYER, concept, randoms)
    v = concept_activation_vector(model, concept, randoms[0], LAYER).vector  # run 0's CAV
    sensitivity = result.sensitivities[0]
    assert sensitivity.abs().min() > 1e-6  # no sign within float noise of 0
    assert 0 < result.scores[0] < 1  # images on both sides: the count is tested

    c, r = Concept(0, "c", None), Concept(1, "r", None)
    with pytest.warns(UserWarning, match="default classifier"):
        captum_tcav = TCAV(model, layers=["blocks.1"], model_id="m", save_path=str(tmp_path))
    CaptumCAV([c, r], "blocks.1", stats={"weights": torch.stack([v, -v]), "classes": [0, 1]},
              save_path=str(tmp_path), model_id="m").save()  # fmt: skip
    out = captum_tcav.interpret(x, [[c, r]], target=2)["0-1"]["blocks.1"]
    assert out["sign_count"][0].item() == result.scores[0].item()
    assert out["magnitude"][0].item() == pytest.approx(sensitivity.double().mean().item(),
                                                       rel=1e-5)  # fmt: skip
    positive_share = sensitivity.clamp_min(0).sum() / sensitivity.abs().sum()
    assert result.magnitudes[0].item() == pytest.approx(positive_share.item(), rel=1e-6)


def test_cav_is_the_classifier_fitted_by_hand():
    model = tiny_vit()
    concept, others = bright(10, 2), noise(9, 3)
    cav = concept_activation_vector(model, concept, others, LAYER, seed=3, test_share=0.3)

    hm = vk.HookedModel(model)

    def flattened(images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return hm.run_with_cache(images, [LAYER])[1][LAYER].reshape(len(images), -1)

    flat = [flattened(concept), flattened(others)]
    generator = torch.Generator().manual_seed(3)  # the concept's split, then the others'
    (held_c, fit_c), (held_o, fit_o) = [held_out_split(len(f), 0.3, generator) for f in flat]
    assert (len(held_c), len(held_o)) == (3, 3)
    assert sorted([*held_c.tolist(), *fit_c.tolist()]) == list(range(10))

    def labelled(c: torch.Tensor, o: torch.Tensor) -> tuple:
        x = torch.cat([flat[0][c], flat[1][o]]).double().numpy()
        return x, [1] * len(c) + [0] * len(o)

    classifier = SGDClassifier(alpha=0.01, max_iter=1000, tol=1e-3, random_state=3)
    classifier.fit(*labelled(fit_c, fit_o))
    expected = torch.from_numpy(classifier.coef_[0])
    torch.testing.assert_close(cav.vector, (expected / expected.norm()).float(), rtol=0,
                               atol=1e-6)  # fmt: skip
    assert cav.accuracy == classifier.score(*labelled(held_c, held_o))
    assert cav.vector.dtype == torch.float32 and cav.dimension == 17 * 16 and cav.layer == LAYER
    assert cav.vector.norm().item() == pytest.approx(1, abs=1e-6)
    assert (flat[0] @ cav.vector).mean() > (flat[1] @ cav.vector).mean()  # toward the concept

    loader = DataLoader(TensorDataset(concept), batch_size=4)  # data sets read as tensors
    again = concept_activation_vector(model, loader, TensorDataset(others), LAYER, seed=3,
                                      test_share=0.3)  # fmt: skip
    torch.testing.assert_close(again.vector, cav.vector, rtol=0, atol=1e-5)


def planted_vit() -> nn.Module:
    """A one-block timm ViT whose output is the mean of its patch tokens (B, 16): no class
    token, position embedding or norms, the block's branches zeroed (it passes its input on),
    an identity head; patch-embedding channel c < 2 is the mean of image channel c over the
    patch, the other channels 0."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, depth=1,
                              embed_dim=16, num_heads=2, num_classes=16, class_token=False,
                              global_pool="avg")  # fmt: skip
    with torch.no_grad():
        model.pos_embed.zero_()
        block = model.blocks[0]
        for linear in (block.attn.proj, block.mlp.fc2, model.patch_embed.proj):
            linear.weight.zero_()
            linear.bias.zero_()
        for channel in range(2):
            model.patch_embed.proj.weight[channel, channel] = 1 / 16
        model.head.weight.copy_(torch.eye(16))
    model.norm, model.fc_norm = nn.Identity(), nn.Identity()
    return model.eval()


@pytest.mark.parametrize("sign", [1, -1])
def test_a_planted_concept_scores_one_and_its_opposite_zero(sign):
    """The target out_0 * sign + out_1^2 (out_c: the mean of image channel c) has the gradient
    (sign e_0 + 2 out_1 e_1) / 16 at every token of the block's output, so along a CAV v,
    S(x) = (sign V_0 + 2 out_1(x) V_1) / 16 with V_c = sum over tokens of v[:, c]. The concept,
    a bright channel 0, gives V_0 >> |V_1|: S has the target's sign on every image. A random
    CAV's V_0 and V_1 are alike, and out_1 = +-2 on alternate images: its S changes sign with
    out_1, a score near 0.5."""
    model, layer = planted_vit(), "blocks.0.hook_resid_post"
    concept, randoms = bright(12, 2, amplitude=6), [noise(12, seed) for seed in range(3, 9)]
    x = noise(16, 1)
    x[:, 1] += torch.tensor([2.0, -2.0]).repeat(8)[:, None, None]
    target = lambda out: sign * out[:, 0] + out[:, 1] ** 2  # noqa: E731
    result = tcav(model, x, target, layer, concept, randoms)

    assert result.scores.tolist() == [1.0 if sign > 0 else 0.0] * 6
    assert bool((result.accuracies == 1).all())  # the concept is linearly separable
    signed = result.sensitivities * sign
    assert signed.min() > 0.15 * signed.abs().max()  # a margin no rounding crosses
    assert 0.3 < result.random_scores.mean() < 0.7
    assert result.significant and result.p_value < 0.01

    cav = concept_activation_vector(model, concept, randoms[0], layer)  # run 0's
    v = cav.vector.double().view(16, 16).sum(0)  # V_c: (channels,)
    out_1 = x[:, 1].double().mean((1, 2))
    closed_form = (sign * v[0] + 2 * out_1 * v[1]) / 16
    torch.testing.assert_close(result.sensitivities[0].double(), closed_form, rtol=1e-5,
                               atol=1e-9)  # fmt: skip


def transformers_backbone() -> nn.Module:
    """A seeded transformers ViTModel (a backbone: pooled embeddings, no logits), float64."""
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=32)  # fmt: skip
    return ViTModel(config).eval().double()


def test_backbone_sensitivities_are_finite_differences_along_the_cav():
    model, layer = transformers_backbone(), "layers.1.hook_resid_post"
    assert layer in vk.HookedModel(model).hook_names()
    concept, others = bright(10, 2).double(), noise(10, 3).double()
    x = noise(6, 1).double()
    cav = concept_activation_vector(model, concept, others, layer)
    first = lambda out: vk.targets.embedding_of(out)[:, 0]  # noqa: E731
    sensitivity = concept_sensitivity(model, x, first, cav)

    hm, step = vk.HookedModel(model), 1e-3
    along = cav.vector.double().view(17, 16)  # the CAV in the activation's shape (N, C)
    ends = []
    for shift in (step * along, -step * along):
        with torch.no_grad(), hm.hooks(fwd={layer: lambda a, name, shift=shift: a + shift}):
            ends.append(first(model(x)))
    finite = (ends[0] - ends[1]) / (2 * step)  # central difference of h(f + eps v)
    assert sensitivity.abs().min() > 1e-5
    torch.testing.assert_close(sensitivity.double(), finite, rtol=1e-4, atol=1e-9)


def test_a_score_target_per_image_follows_its_images_through_batches():
    model, layer = transformers_backbone(), "layers.1.hook_resid_post"
    concept, randoms = bright(10, 2).double(), [noise(10, 3).double(), noise(10, 4).double()]
    x = noise(6, 1).double()
    similar = vk.targets.similar_to(vk.targets.embed(model, noise(6, 5).double()))  # (6, D)
    whole = tcav(model, x, similar, layer, concept, randoms)
    batched = tcav(model, x, similar, layer, concept, randoms, batch_size=4)
    torch.testing.assert_close(batched.sensitivities, whole.sensitivities, rtol=1e-5, atol=1e-9)
    cav = concept_activation_vector(model, concept, randoms[0], layer)  # run 0's
    alone = [concept_sensitivity(model, x[i : i + 1], vk.targets.similar_to(similar.reference[i]),
                                 cav) for i in range(6)]  # fmt: skip
    torch.testing.assert_close(whole.sensitivities[0], torch.cat(alone), rtol=1e-5, atol=1e-9)
    assert whole.target == "similarity"
    with pytest.raises(ValueError, match="ViTModel is a backbone"):
        tcav(model, x, 0, layer, concept, randoms)  # a class index on embeddings


def test_one_class_per_image_follows_its_images_through_batches():
    model, x = tiny_vit(), noise(7, 1)
    cav = concept_activation_vector(model, bright(8, 2), noise(8, 3), LAYER)
    classes = [0, 1, 2, 2, 1, 0, 1]
    mixed = concept_sensitivity(model, x, classes, cav, batch_size=3)
    each = torch.stack([concept_sensitivity(model, x, k, cav) for k in range(3)])  # (3, N)
    torch.testing.assert_close(mixed, each[classes, torch.arange(7)], rtol=1e-5, atol=1e-9)


def test_the_model_is_left_as_it_was():
    model = tiny_vit()
    model.train()
    model.pos_embed.requires_grad_(False)
    model.head.weight.grad = torch.ones_like(model.head.weight)
    before = full_state(model)
    tcav(model, noise(4, 1), 0, LAYER, bright(6, 2), [noise(6, 3), noise(6, 4)])
    assert_full_state(model, before)
    with pytest.raises(ValueError, match="out of range"):
        tcav(model, noise(4, 1), 5, LAYER, bright(6, 2), [noise(6, 3), noise(6, 4)])
    assert_full_state(model, before)


def test_the_result_survives_strict_json():
    result = tcav(tiny_vit(), noise(4, 1), [0, 1, 2, 0], LAYER, bright(6, 2),
                  [noise(6, 3), noise(6, 4)])  # fmt: skip
    assert result.target == [0, 1, 2, 0] and result.image_size == (16, 16)
    assert result.layout.grid == (4, 4) and result.options["runs"] == 2
    untestable = dataclasses.replace(result, p_value=math.nan, significant=False)
    for one in (result, untestable):
        data = json.dumps(one.to_dict(), allow_nan=False)
        back = Result.from_dict(json.loads(data))
        assert isinstance(back, TCAVResult) and json.dumps(back.to_dict()) == data
        assert torch.equal(back.sensitivities, one.sensitivities)
    assert math.isnan(Result.from_dict(json.loads(json.dumps(untestable.to_dict()))).p_value)


def _refusals() -> dict:
    """name -> (call on a model, exception, message pattern)."""
    x, concept, randoms = noise(4, 1), bright(6, 2), [noise(6, 3), noise(6, 4)]
    empty = torch.empty(0, 3, 16, 16)
    shuffled = DataLoader(TensorDataset(concept), shuffle=True)
    return {
        "unknown layer": (lambda m: tcav(m, x, 0, "blocks.9.hook_resid_post", concept, randoms),
                          KeyError, "No hook name matches 'blocks.9.hook_resid_post'"),
        "one random set": (lambda m: tcav(m, x, 0, LAYER, concept, randoms[:1]),
                           ValueError, r"R >= 2 random sets"),
        "random sets as one tensor": (lambda m: tcav(m, x, 0, LAYER, concept, randoms[0]),
                                      TypeError, r"randoms must be a list .*chunk"),
        "empty concept": (lambda m: tcav(m, x, 0, LAYER, empty, randoms),
                          ValueError, "No images in the concept"),
        "empty random set": (lambda m: tcav(m, x, 0, LAYER, concept, [randoms[0], empty]),
                             ValueError, r"No images in randoms\[1\]"),
        "empty images": (lambda m: tcav(m, empty, 0, LAYER, concept, randoms),
                         ValueError, "No images in the images explained"),
        "one concept image": (lambda m: tcav(m, x, 0, LAYER, concept[:1], randoms),
                              ValueError, "Only 1 image in the concept"),
        "images of another size": (lambda m: tcav(m, noise(4, 1, 32), 0, LAYER, concept,
                                                  randoms),
                                   ValueError, "built for 16x16 inputs"),
        "concept of another size": (lambda m: concept_activation_vector(m, noise(4, 1, 32),
                                                                        concept, LAYER),
                                    ValueError, "built for 16x16 inputs"),
        "class out of range": (lambda m: tcav(m, x, 7, LAYER, concept, randoms),
                               ValueError, "Target class 7 is out of range"),
        "classes of another count": (lambda m: tcav(m, x, [0, 1], LAYER, concept, randoms),
                                     ValueError, "Got 2 targets for a batch of 4"),
        "alpha": (lambda m: tcav(m, x, 0, LAYER, concept, randoms, alpha=1.5),
                  ValueError, r"alpha must be a number in \(0, 1\)"),
        "test share": (lambda m: concept_activation_vector(m, concept, x, LAYER, test_share=1),
                       ValueError, r"test_share must be a number in \(0, 1\)"),
        "over max_bytes": (lambda m: tcav(m, x, 0, LAYER, concept, randoms, max_bytes=10_000),
                           ValueError, "above max_bytes=10,000"),
        "shuffled loader": (lambda m: concept_activation_vector(m, shuffled, x, LAYER),
                            ValueError, "shuffle=False"),
        "CAV of another dimension": (
            lambda m: concept_sensitivity(m, x, 0, CAV(torch.ones(5) / 5**0.5, LAYER, 1.0)),
            ValueError, f"The CAV has 5 values but {LAYER} flattens to 272"),
        "not a CAV": (lambda m: concept_sensitivity(m, x, 0, torch.ones(272)),
                      TypeError, "cav must be a CAV"),
        "sets of two sizes": (
            lambda m: concept_activation_vector(m, concept, noise(4, 1, 32), LAYER),
            ValueError, "272 values per image, the counterexamples' 1040: give images of one"),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(_refusals()))
def test_refusals_say_what_and_leave_the_model_as_it_was(name):
    call, error, pattern = _refusals()[name]
    model = tiny_vit(dynamic_img_size=name == "sets of two sizes")
    before = full_state(model)
    with pytest.raises(error, match=pattern):
        call(model)
    assert_full_state(model, before)


def test_a_cav_vector_is_one_floating_axis():
    with pytest.raises(TypeError, match=r"\(D,\) floating tensor; got \(2, 3\)"):
        CAV(torch.ones(2, 3), LAYER, 1.0)
    with pytest.raises(TypeError, match="got list"):
        CAV([1.0, 0.0], LAYER, 1.0)


def test_a_concept_no_more_separable_than_noise_is_warned_of():
    """The concept and every random set the same images: every CAV, the concept's and the
    random ones, is fitted on the same sets, so they are exactly as accurate and tcav warns
    that the score says little; the planted bright concept (accuracy 1 against noise) is not
    warned of."""
    import warnings

    model, layer = planted_vit(), "blocks.0.hook_resid_post"
    same = noise(12, 3)
    x = noise(8, 1)
    target = lambda out: out[:, 0]  # noqa: E731
    with pytest.warns(UserWarning, match="not linearly separable at blocks.0.hook_resid_post"):
        result = tcav(model, x, target, layer, same, [same] * 4)
    assert torch.equal(result.accuracies, result.random_accuracies)
    randoms = [noise(12, seed) for seed in range(3, 7)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tcav(model, x, target, layer, bright(12, 2, amplitude=6), randoms)
