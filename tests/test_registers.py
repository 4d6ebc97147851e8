"""Test-time registers (Jiang et al. 2025) on a ViT with a planted register neuron, checked
against the reference code's steps (nickjiang2378/test-time-registers: ``find_register_neurons``
in shared/algorithms.py, ``activate_on_registers`` in shared/hook_fn.py) written out below one
image at a time, as the reference runs them."""

from __future__ import annotations

import copy

import pytest
import timm
import torch
from conftest import model_state
from guide_example import run_first_example

import vizkit as vk
from vizkit.registers.planted import PLANTED_NEURON, bright_patch_images, planted_register_vit

LAYER, NEURON = PLANTED_NEURON

THRESHOLD = 50.0  # the bright patch reaches ~165 at the last block, the others ~5


def reference_neuron_scores(model, images, threshold, detect=-1, sparsity=True):
    """shared/algorithms.py ``find_register_neurons`` with ``apply_sparsity_filter``: per image,
    the tokens above ``threshold`` at the detection block's output, each layer's mean |act| there
    times the sparsity filter; averaged over the images that have any."""
    scores = []
    for image in images:
        acts, outs = [], []
        hooks = [b.mlp.act.register_forward_hook(_record(acts)) for b in model.blocks]
        hooks += [b.register_forward_hook(_record(outs)) for b in model.blocks]
        with torch.no_grad():
            model(image[None])
        for hook in hooks:
            hook.remove()
        norm_map = outs[detect].norm(dim=1)
        filtered = norm_map.clone()
        filtered[filtered < threshold] = 0
        locations = torch.where(filtered > threshold)[0]
        if len(locations) == 0:
            continue
        assert 0 not in locations  # the class token is no outlier here (vizkit counts patches)
        per_layer = []
        for act in acts:
            values = act[locations].abs()
            score = values.mean(0)
            if sparsity:
                sparse = (act < 0.5).sum(0) >= 0.5 * act.shape[0]
                score = score * sparse.float()
            per_layer.append(score)
        scores.append(torch.stack(per_layer))
    return torch.stack(scores).mean(0)  # (L, J)


def _record(store: list):
    def hook(module, inputs, output):
        store.append(output[0])

    return hook


def reference_forward(model, image, neurons, registers=1, scale=1.0):
    """One image through the ViT with ``registers`` zero tokens appended after the position
    embedding and shared/hook_fn.py ``activate_on_registers`` (normal_values="zero") on the
    MLP activations of each listed layer."""

    def activate(indices):
        def hook(module, inputs, output):
            output = output.clone()
            chosen = output[0, :, indices]
            high, low = chosen.max(), chosen.min()
            extreme = high if abs(high) > abs(low) else low  # the reference's sign_max
            output[0, -registers:, indices] = scale * extreme
            output[0, 1:-registers, indices] = 0
            return output

        return hook

    hooks = [model.blocks[layer].mlp.act.register_forward_hook(activate(torch.tensor(indices)))
             for layer, indices in neurons.items()]  # fmt: skip
    with torch.no_grad():
        x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(image[None]))))
        x = torch.cat([x, x.new_zeros(1, registers, x.shape[-1])], 1)
        x = model.blocks(x)
        stream = x[:, -registers:]
        out = model.forward_head(model.norm(x[:, :-registers]))
    for hook in hooks:
        hook.remove()
    return out[0], stream[0]


@pytest.fixture(scope="module")
def planted():
    return planted_register_vit(), bright_patch_images(8)[0]


def test_the_neuron_scores_are_the_reference_algorithms(planted):
    model, x = planted
    found = vk.registers.register_neurons(model, x, threshold=THRESHOLD, top_k=5, batch_size=3,
                                     progress=False)  # fmt: skip
    expected = reference_neuron_scores(model, x, THRESHOLD)
    torch.testing.assert_close(found.scores, expected, rtol=1e-4, atol=1e-6)
    assert found.neurons[0] == (f"blocks.{LAYER}", NEURON)
    assert found.neuron_scores[0] > 10 * found.neuron_scores[1]
    assert (found.images, found.with_outliers, found.outliers) == (8, 8, 1.0)
    ranked = expected.flatten().argsort(descending=True)[:5]
    assert [(f"blocks.{int(i) // expected.shape[1]}", int(i) % expected.shape[1])
            for i in ranked] == found.neurons  # fmt: skip
    # the artifact appears at the planted block: its patch's norm jumps there
    assert found.outlier_norms[LAYER] > 20 * found.other_norms[LAYER]
    assert found.outlier_norms[LAYER - 1] < 10 * found.other_norms[LAYER - 1]


def test_the_default_cut_finds_the_planted_neuron_without_a_threshold(planted):
    model, x = planted
    found = vk.registers.register_neurons(model, x, top_k=3, progress=False)
    assert found.neurons[0] == (f"blocks.{LAYER}", NEURON)
    assert found.by_block()[f"blocks.{LAYER}"] == [NEURON]


def test_the_scoring_pass_stops_after_the_last_candidate_block(planted):
    """Issue 70: the second pass runs no block after the candidates, and scores as the
    reference does (its rows of those blocks), also with the candidates out of order."""
    model, x = planted
    runs = []
    handle = model.blocks[-1].register_forward_pre_hook(lambda m, a: runs.append(len(a[0])))
    try:
        found = vk.registers.register_neurons(model, x, layers=[1, 0], threshold=THRESHOLD,
                                         top_k=3, batch_size=3, progress=False)  # fmt: skip
    finally:
        handle.remove()
    assert runs == [3, 3, 2]  # the norms' pass only
    assert found.blocks == ["blocks.1", "blocks.0"]  # as asked
    expected = reference_neuron_scores(model, x, THRESHOLD)[[1, 0]]
    torch.testing.assert_close(found.scores, expected, rtol=1e-4, atol=1e-6)
    assert found.neurons[0] == (f"blocks.{LAYER}", NEURON)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_the_register_matches_the_reference_intervention_on_every_image(planted, scale):
    model, x = planted
    neurons = {LAYER: [NEURON, 3], LAYER + 1: [11]}
    with vk.registers.test_time_register(model, neurons, scale=scale) as register, torch.no_grad():
        out = model(x)
    for i, image in enumerate(x):
        expected, stream = reference_forward(model, image, neurons, scale=scale)
        torch.testing.assert_close(out[i], expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(register.stream[i], stream, rtol=1e-4, atol=1e-5)


def test_the_register_takes_the_artifact_and_the_attention(planted):
    model, x = planted
    where = bright_patch_images(8)[1]
    effect = vk.registers.register_effect(model, x, {LAYER: [NEURON]}, steps=4)
    before, after = effect.norms.flatten(2)  # (B, Np) each
    rows = torch.arange(len(x))
    assert (before[rows, where] > 20 * before.median(-1).values).all()
    assert (after[rows, where] < 10 * after.median(-1).values).all()
    assert (effect.register_norms[:, 0] > 0.8 * before[rows, where]).all()
    peaks = effect.peak_ratio()
    assert (peaks[0] > 50).all() and (peaks[1] < 10).all()
    assert effect.attention[0].flatten(1).argmax(-1).equal(where)
    assert (effect.register_attention[:, 0] > 0.5).all()  # the class token now reads the register
    assert (effect.output_cosine > 0.9).all() and effect.agreement.all()
    assert effect.deletion.shape == effect.insertion.shape == (2, len(x))


def test_the_sparsity_filter_counted_in_parts_is_the_whole_count():
    """The filter counts 32 tokens at a time; the count is the reference's over every token,
    at the boundary (exactly half the tokens below 0.5) too."""
    from vizkit.registers.neurons import _sparse

    hidden = torch.randn(3, 101, 40, generator=torch.Generator().manual_seed(0))
    hidden[0, :, 0] = torch.where(torch.arange(101) < 51, 0.0, 1.0)  # 51 of 101 below
    hidden[0, :, 1] = torch.where(torch.arange(101) < 50, 0.0, 1.0)  # 50 of 101
    expected = (hidden < 0.5).sum(1) >= 0.5 * hidden.shape[1]
    assert torch.equal(_sparse(hidden), expected)
    assert expected[0, 0] and not expected[0, 1]


@pytest.mark.parametrize("head", [10, 0])
def test_the_curves_are_the_metrics_own_on_each_model(planted, head):
    """Issue 70: the curves start from the runs already made (no clean run again); their AUCs
    are those of `vk.metrics.deletion` and `insertion` run on their own, for a classifier and
    for a backbone scored by its own embedding."""
    model, x = copy.deepcopy(planted[0]), planted[1][:3]
    model.reset_classifier(head)
    effect = vk.registers.register_effect(model, x, {LAYER: [NEURON]}, steps=4)
    targets = [None, None]
    if not head:
        with torch.no_grad():
            plain = model(x)
            with vk.registers.test_time_register(model, {LAYER: [NEURON]}):
                targets = [vk.targets.similar_to(o) for o in (plain, model(x))]
    expected = {"deletion": [], "insertion": []}
    contexts = [torch.no_grad(), vk.registers.test_time_register(model, {LAYER: [NEURON]})]
    for i, context in enumerate(contexts):
        with context:
            for kind in expected:
                curve = getattr(vk.metrics, kind)(model, x, effect.attention[i], targets[i],
                                                  steps=4, progress=False)  # fmt: skip
                expected[kind].append(curve.auc)
    for kind, aucs in expected.items():
        torch.testing.assert_close(getattr(effect, kind), torch.stack(aucs), rtol=1e-5,
                                   atol=1e-6)  # fmt: skip


def test_a_backbone_is_scored_by_its_own_embedding(planted):
    model, x = planted
    model.reset_classifier(0)
    try:
        effect = vk.registers.register_effect(model, x[:2], {LAYER: [NEURON]}, steps=2)
    finally:
        model.reset_classifier(10)
    assert effect.agreement is None and effect.deletion.shape == (2, 2)


def test_nothing_outlives_the_context_also_after_an_error_or_a_refusal(planted):
    model, x = planted
    model.train()
    before, plain = model_state(model), model.eval()(x)
    model.train()
    with pytest.raises(ZeroDivisionError), vk.registers.test_time_register(model, {1: [0]}):
        assert model.eval()(x).shape == plain.shape
        model.train()
        raise ZeroDivisionError
    assert model_state(model) == before
    beit = timm.create_model("beit_base_patch16_224", img_size=32, patch_size=8, depth=2,
                             embed_dim=64, num_heads=2, num_classes=10)  # fmt: skip
    beit_before = model_state(beit)
    with pytest.raises(ValueError, match="position"):
        with vk.registers.test_time_register(beit, {0: [0]}):
            pass
    assert model_state(beit) == beit_before
    torch.testing.assert_close(model.eval()(x), plain)
    model.eval()


def test_a_model_without_artifacts_is_refused_with_a_fix_that_works():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32, patch_size=8,
                              depth=2, embed_dim=64, num_heads=2)  # fmt: skip
    x = torch.randn(4, 3, 32, 32)
    with pytest.raises(ValueError, match="needs no register") as error:
        vk.registers.register_neurons(model, x, progress=False)
    assert "threshold=" in str(error.value)
    found = vk.registers.register_neurons(model, x, threshold=1.0, top_k=2, progress=False)
    assert found.with_outliers == 4
    with pytest.raises(ValueError, match=r"threshold must be a finite number > 0"):
        vk.registers.register_neurons(model, x, threshold=-1, progress=False)  # all were artifacts


def test_bad_neurons_and_options_are_refused(planted):
    model, _ = planted
    with pytest.raises(ValueError, match="its MLP has 256 neurons"):
        with vk.registers.test_time_register(model, {1: [256]}):
            pass
    with pytest.raises(KeyError, match="blocks.9"):
        with vk.registers.test_time_register(model, {"blocks.9": [1]}):
            pass
    with pytest.raises(TypeError, match="non-empty"):
        with vk.registers.test_time_register(model, {}):
            pass
    with pytest.raises(ValueError, match="patches"):
        with vk.registers.test_time_register(model, {1: [1]}, patches="noise"):
            pass


def test_a_grid_of_windows_is_refused():
    model = timm.create_model("swin_tiny_patch4_window7_224", img_size=64, window_size=4,
                              embed_dim=32, depths=(1, 1), num_heads=(1, 2))  # fmt: skip
    with pytest.raises(ValueError, match="flat stream"):
        with vk.registers.test_time_register(model, {0: [0]}):
            pass


def test_a_position_dependent_attention_is_refused():
    model = timm.create_model("beit_base_patch16_224", img_size=32, patch_size=8, depth=2,
                              embed_dim=64, num_heads=2, num_classes=10)  # fmt: skip
    with pytest.raises(ValueError, match="position"):
        vk.registers.register_effect(model, torch.randn(2, 3, 32, 32), {0: [0]}, faithfulness=False)


def test_rotary_positions_counted_from_the_end_are_refused_not_misread():
    """transformers' DINOv3 applies its rotary embeddings to the last Np tokens, so a token
    appended at the end would shift every patch's position without an error: the position
    check at entry sees the output move and refuses."""
    pytest.importorskip("transformers")
    from vizkit.models.representatives import LIBRARIES

    model = LIBRARIES["transformers"]["DINOv3ViTModel + linear probe"].build().eval()
    with pytest.raises(ValueError, match="output moved"):
        with vk.registers.test_time_register(model, {0: [0]}, image_size=(32, 32)):
            pass


def test_the_guide_example_prints_what_the_guide_says():
    printed, said = run_first_example("test-time-registers.md")
    assert printed == said


def test_a_half_precision_model_passes_the_position_check_run_in_float32():
    model = planted_register_vit().to(torch.bfloat16)
    x = bright_patch_images(4)[0].to(torch.bfloat16)
    effect = vk.registers.register_effect(model, x, {LAYER: [NEURON]}, faithfulness=False)
    assert (effect.peak_ratio()[0] > 50).all() and (effect.peak_ratio()[1] < 10).all()
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # the check used a copy


def test_the_models_own_errors_are_not_called_positional():
    model = planted_register_vit()
    with pytest.raises(RuntimeError, match="channels"):
        with vk.registers.test_time_register(model, {LAYER: [NEURON]}), torch.no_grad():
            model(torch.randn(2, 1, 32, 32))  # a wrong image: the model's own error, unchanged


def test_neuron_indices_of_any_integer_type_and_no_bools():
    import numpy as np

    model, x = planted_register_vit(), bright_patch_images(2)[0]
    with vk.registers.test_time_register(model, {LAYER: np.array([NEURON])}) as numpy_chosen:
        model(x)
    assert numpy_chosen.neurons == {f"blocks.{LAYER}": [NEURON]}
    with pytest.raises(TypeError, match="ints"):
        with vk.registers.test_time_register(model, {LAYER: [True]}):
            pass
    with pytest.raises(ValueError, match="names 4 blocks"):
        with vk.registers.test_time_register(model, {"blocks.*": [1]}):
            pass


class _LowRankAdapter(torch.nn.Module):
    """A LoRA-style adapter around a linear layer (as peft wraps one): base + B(A(x))."""

    def __init__(self, base: torch.nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_A = torch.nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = torch.nn.Linear(rank, base.out_features, bias=False)

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x))


def test_an_adapter_is_not_taken_for_the_mlp_projection():
    model = planted_register_vit()
    for block in model.blocks:
        block.mlp.fc2 = _LowRankAdapter(block.mlp.fc2)
    with pytest.raises(ValueError, match="merge adapters"):
        vk.registers.register_neurons(model, bright_patch_images(2)[0], progress=False)
