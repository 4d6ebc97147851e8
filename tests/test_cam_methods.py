"""The CAM family on the CAM template (`vizkit.methods`), each against pytorch-grad-cam on the
same model, activations and gradients (its ``get_cam_image`` fed vizkit's (B, C, h, w) tensors,
the token reshape written here by hand), or against the paper's equation written out; and the
method registry every list of methods reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import build, pass_budget
from pytorch_grad_cam import (
    AblationCAM,
    GradCAMPlusPlus,
    HiResCAM,
    LayerCAM,
    ScoreCAM,
    XGradCAM,
)
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection

import vizkit as vk
from vizkit.datasets import load_sample
from vizkit.methods import METHODS

GRADIENT_CAMS = {
    "gradcam_pp": GradCAMPlusPlus,
    "xgradcam": XGradCAM,
    "hirescam": HiResCAM,
    "layercam": LayerCAM,
}


@pytest.fixture(scope="module")
def vit():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    x, labels, _ = load_sample()
    return model, x[:6], labels[:6]


@pytest.fixture(scope="module")
def cnn():
    model, _ = vk.zoo.load("resnet_tiny_shapes")
    x, labels, _ = load_sample()
    return model, x[:6], labels[:6]


def activation_and_gradient(model, x, labels, layer):
    """The (B, C, h, w) activation and gradient at ``layer``, reshaped here by hand: a token
    activation's patch tokens (after the prefix) laid out row by row on the patch grid."""
    hm = vk.HookedModel(model)
    _, cache = hm.run_with_cache(x, names=layer, grads=True, target=labels)
    act, grad = cache[layer], cache[f"{layer}_grad"]
    if act.ndim == 3:
        layout = hm.token_layout(tuple(x.shape[-2:]), layer)
        p, (gh, gw) = layout.num_prefix_tokens, layout.grid
        act, grad = (t[:, p:].reshape(len(t), gh, gw, -1).permute(0, 3, 1, 2) for t in (act, grad))
    return act, grad


@pytest.mark.parametrize("name", list(GRADIENT_CAMS))
@pytest.mark.parametrize("kind", ["vit", "cnn"])
def test_gradient_cams_equal_pytorch_grad_cam(name, kind, request):
    model, x, labels = request.getfixturevalue(kind)
    ours = getattr(vk, name)(model, x, target=labels)
    layer = ours.options["layer"]
    act, grad = activation_and_gradient(model, x, labels, layer)
    reference = GRADIENT_CAMS[name](model, target_layers=[])
    targets = [ClassifierOutputTarget(int(t)) for t in labels]
    theirs = reference.get_cam_image(x, None, targets, *(t.double().numpy() for t in (act, grad)),
                                     False)  # fmt: skip
    expected = torch.from_numpy(np.maximum(theirs, 0)).float()  # both in float64, then float32
    torch.testing.assert_close(ours.maps, expected, rtol=1e-5, atol=1e-6 * expected.abs().max())
    assert ours.maps.shape == act.shape[:1] + act.shape[2:]


@pytest.mark.parametrize("shape", [(3, 10, 40), (3, 40, 10)])
def test_eigencams_component_is_the_svds_from_either_gram(shape):
    """s1 u1 from the positions' Gram (fewer positions) or A v1 from the channels' (fewer
    channels) equals the singular value decomposition's, up to the sign."""
    from vizkit.methods.eigencam import _first_component

    a = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    _, _, vh = torch.linalg.svd(a, full_matrices=False)
    expected = (a @ vh[:, :1].transpose(1, 2))[..., 0]
    ours = _first_component(a)
    signs = torch.sign((ours * expected).sum(1, keepdim=True))
    torch.testing.assert_close(ours * signs, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", ["vit", "cnn"])
def test_eigencam_is_the_first_principal_component(kind, request):
    model, x, _ = request.getfixturevalue(kind)
    ours = vk.eigencam(model, x)
    hm = vk.HookedModel(model)
    _, cache = hm.run_with_cache(x, names=ours.options["layer"])
    act = cache[ours.options["layer"]]
    if act.ndim == 3:
        layout = ours.layout
        act = act[:, layout.num_prefix_tokens :].reshape(len(x), *layout.grid, -1)
        act = act.permute(0, 3, 1, 2)
    projection = torch.from_numpy(get_2d_projection(act.double().numpy()))
    flat = projection.flatten(1)  # vizkit's sign: the largest-magnitude entry positive
    signs = torch.where(flat.gather(1, flat.abs().argmax(1, keepdim=True))[:, 0] < 0, -1.0, 1.0)
    expected = (projection * signs[:, None, None]).clamp_min(0).float()
    torch.testing.assert_close(ours.maps, expected, rtol=1e-4, atol=1e-4 * expected.abs().max())
    assert ours.targets is None  # class-agnostic


def test_scorecam_equals_pytorch_grad_cam(vit):
    model, x, labels = vit
    x, labels = x[:2], labels[:2]
    ours = vk.scorecam(model, x, target=labels)
    act, grad = activation_and_gradient(model, x, labels, ours.options["layer"])
    reference = ScoreCAM(model, target_layers=[])
    targets = [ClassifierOutputTarget(int(t)) for t in labels]
    theirs = reference.get_cam_image(x, None, targets, act.numpy(), grad.numpy(), False)
    expected = torch.from_numpy(np.maximum(theirs, 0)).float()
    torch.testing.assert_close(ours.maps, expected, rtol=1e-4, atol=1e-5 * expected.abs().max())


def test_ablationcam_equals_pytorch_grad_cam_on_a_relu_network(cnn):
    """On post-ReLU feature maps pytorch-grad-cam ablates with zeros, as the paper does (on
    signed activations it subtracts 1e7 instead: compared to the equation below)."""
    model, x, labels = cnn
    ours = vk.ablationcam(model, x, target=labels)
    with AblationCAM(model, target_layers=[model.layer4]) as cam:
        theirs = cam(x, targets=[ClassifierOutputTarget(int(t)) for t in labels])
    upsampled = ours.upsample().numpy()
    for a, b in zip(upsampled, theirs, strict=True):
        if a.std() > 0 and b.std() > 0:
            assert np.corrcoef(a.ravel(), b.ravel())[0, 1] >= 0.999


def test_ablationcam_on_tokens_is_the_relative_score_drop(vit):
    """(y - y_k) / y with channel k of the patch tokens zeroed, one forward per channel here."""
    model, x, labels = vit
    x, labels = x[:2], labels[:2]
    ours = vk.ablationcam(model, x, target=labels, max_bytes=pass_budget(model, x, 7, False))
    layer = ours.options["layer"]
    hm = vk.HookedModel(model)
    act, _ = activation_and_gradient(model, x, labels, layer)
    prefix = ours.layout.num_prefix_tokens
    with torch.no_grad():
        clean = model(x).gather(1, labels[:, None])[:, 0]
    weights = torch.zeros(act.shape[:2])
    for k in range(act.shape[1]):

        def zero(tokens, *, name, k=k):
            tokens = tokens.clone()
            tokens[:, prefix:, k] = 0
            return tokens

        with torch.no_grad(), hm.hooks(fwd={layer: zero}):
            dropped = hm(x).gather(1, labels[:, None])[:, 0]
        weights[:, k] = (clean - dropped) / clean
    expected = (weights[:, :, None, None] * act).sum(1).clamp_min(0)
    torch.testing.assert_close(ours.maps, expected, rtol=1e-4, atol=1e-5 * expected.abs().max())


@pytest.mark.parametrize("name", ["gradcam_pp", "xgradcam", "hirescam", "layercam", "eigencam",
                                  "scorecam", "ablationcam"])  # fmt: skip
def test_every_cam_runs_on_hierarchical_and_class_attention_families(name):
    for key in ("cait", "vit_reg_avg"):
        model, x = build(key)
        result = getattr(vk, name)(model, x[:2])
        assert result.maps.ndim == 3 and len(result.maps) == 2
        assert torch.isfinite(result.maps).all()


def test_the_registry_feeds_exports_and_compare():
    registered = dict(METHODS)
    expected = {"rollout", "grad_rollout", "class_attention", "gradcam", "integrated_gradients",
                "saliency", "occlusion", "random", "gradcam_pp", "xgradcam", "hirescam",
                "layercam", "eigencam", "scorecam", "ablationcam"}  # fmt: skip
    assert expected <= set(registered) and set(METHODS) == set(registered)
    for name, method in registered.items():
        if not method.fn.__module__.startswith("vizkit."):
            continue  # one a test or a how-to registered
        assert getattr(vk, method.fn.__name__) is method.fn, name  # exported by its name
        assert method.fn.__name__ in vk.__all__
        assert method.summary and set(method.needs) <= set(vk.methods.NEEDS)
    model, x = build("vit")
    table = vk.compare_saliency(model, x[:4], methods=["gradcam_pp", "eigencam", "random"],
                                steps=4, progress=False)  # fmt: skip
    assert table.methods == ["gradcam_pp", "eigencam", "random"]


def ablation_and_first_block(model, x, **kwargs):
    """`vk.ablationcam` of ``model`` (blocks in ``model.blocks`` or ``model.vit.blocks``) and
    the images its first block ran on in it."""
    calls = []
    blocks = model.blocks if hasattr(model, "blocks") else model.vit.blocks
    handle = blocks[0].register_forward_hook(lambda m, i, o: calls.append(len(o)))
    try:
        return vk.ablationcam(model, x, **kwargs), sum(calls)
    finally:
        handle.remove()


def last_block_input(model) -> str:
    return f"blocks.{len(model.blocks) - 1}.hook_resid_pre"


def test_ablationcam_runs_the_ablated_copies_from_the_layers_block_on(vit, monkeypatch):
    """At a block's input of a family whose head reads the last block, the ablated copies run
    from that block on (the blocks before it run only for the clean runs) and give what the
    whole model gives, which runs where the clean run does not prove that path."""
    from vizkit.analysis import resume

    model, x, labels = vit
    x, labels = x[:2], labels[:2]
    options = {"target": labels, "layer": last_block_input(model),
               "max_bytes": pass_budget(model, x, 16, gradients=False)}  # fmt: skip
    resumed, calls = ablation_and_first_block(model, x, **options)
    channels = model.embed_dim
    assert calls < channels  # the copies skipped the first block
    monkeypatch.setattr(resume, "_reproduces", lambda *args: "refused by the test")
    whole, calls = ablation_and_first_block(model, x, **options)
    assert calls >= 2 * channels  # each image's copies ran the whole model
    torch.testing.assert_close(resumed.maps, whole.maps, rtol=1e-4, atol=1e-6)


def test_ablationcam_of_one_image_is_its_map_in_a_batch(monkeypatch):
    """A batch of one image is proved beside its companion (-x[0]) and runs from the layer on,
    as a batch of two and one of identical images do; with the proof refused the whole model
    runs. Each gives an image the map it has in the batch of two (each image's score y taken
    from the batch's clean run); a score target with a reference per image scores each image's
    copies with its own."""
    from vizkit.analysis import resume

    model, x = build("vit")
    with torch.no_grad():
        logits = model(x)
    noise = torch.randn(logits.shape, generator=torch.Generator().manual_seed(3))
    reference = logits + logits.std() * noise  # cosine about 0.7: a score that moves
    options = {"layer": last_block_input(model), "max_bytes": pass_budget(model, x, 16, False)}
    channels = model.embed_dim
    both, calls = ablation_and_first_block(
        model, x, target=vk.targets.similar_to(reference), **options
    )
    assert calls < channels  # from the layer on
    for proof, ran in ((None, lambda calls: calls < channels),
                       ("refused by the test", lambda calls: calls >= channels)):  # fmt: skip
        if proof:
            monkeypatch.setattr(resume, "_reproduces", lambda *args, why=proof: why)
        for b in range(len(x)):
            one, calls = ablation_and_first_block(
                model, x[b : b + 1], target=vk.targets.similar_to(reference[b]), **options
            )
            assert ran(calls)
            torch.testing.assert_close(one.maps[0], both.maps[b], rtol=1e-4, atol=1e-6)
    monkeypatch.undo()
    for target in (None, 7):  # class targets: the logit of row b
        both = vk.ablationcam(model, x, target=target, **options)
        twice, calls = ablation_and_first_block(model, x[[1, 1]], target=target, **options)
        assert calls < channels
        torch.testing.assert_close(twice.maps, both.maps[[1, 1]], rtol=1e-4, atol=1e-6)


class DictOutput(torch.nn.Module):
    """A ViT whose output is a dict ``{"logits": (B, K)}``."""

    def __init__(self, vit: torch.nn.Module):
        super().__init__()
        self.vit = vit

    def forward(self, x):
        return {"logits": self.vit(x)}


def test_a_score_target_on_an_output_object_is_given_the_object():
    """The resumed path gives the logits tensor: a class target reads it from there; a score
    target, which may read any part of the model's output, gets the whole model's."""
    model, x = build("vit")
    wrapped = DictOutput(model).eval()
    options = {"layer": f"vit.{last_block_input(model)}",
               "max_bytes": pass_budget(model, x, 16, False)}  # fmt: skip
    by_class, calls = ablation_and_first_block(wrapped, x, target=3, **options)
    assert calls < model.embed_dim  # from the layer on
    scored, calls = ablation_and_first_block(
        wrapped, x, target=lambda out: out["logits"][:, 3], **options
    )
    assert calls >= 2 * model.embed_dim  # the whole model
    torch.testing.assert_close(scored.maps, by_class.maps, rtol=1e-4, atol=1e-6)


def test_ablationcam_zeroes_the_channel_of_a_channels_last_feature_map():
    """A (B, h, w, C) activation: the channel is its last axis where the model holds it."""

    class ChannelsLast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 2, stride=2)  # 32 px -> 16 x 16
            self.lin = torch.nn.Linear(16, 6)  # on (B, 16, 16, 16): channels last
            self.fc = torch.nn.Linear(6, 5)

        def forward(self, x):
            return self.fc(self.lin(self.conv(x).permute(0, 2, 3, 1)).mean((1, 2)))

    torch.manual_seed(0)
    model, x = ChannelsLast().eval(), torch.randn(1, 3, 32, 32)
    ours = vk.ablationcam(model, x, target=0, layer="lin.hook_out")
    with torch.no_grad():
        score = model(x)[0, 0]
        act = model.lin(model.conv(x).permute(0, 2, 3, 1))
        weights = []
        for k in range(6):
            ablated = act.clone()
            ablated[..., k] = 0
            weights.append((score - model.fc(ablated.mean((1, 2)))[0, 0]) / score)
    expected = (torch.stack(weights)[None, :, None, None] * act.permute(0, 3, 1, 2)).sum(1)
    torch.testing.assert_close(ours.maps, expected.clamp_min(0), rtol=1e-4, atol=1e-6)
