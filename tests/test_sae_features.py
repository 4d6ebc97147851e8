"""Features of a sparse autoencoder against brute force over the store's rows (top patches and
images, densities, heat maps, the latents at a token, class AUCs against scikit-learn, the
share on object masks), its logit effects against the head computed by hand, and ablation and
steering against a plain torch hook."""

from __future__ import annotations

import pytest
import timm
import torch
from sklearn.metrics import roc_auc_score
from test_sae import state

import vizkit as vk
from vizkit.sae import latent_stats
from vizkit.sae.effects import ablate, effects_and_run, logit_effects, steer
from vizkit.sae.latent_stats import features

LAST = "blocks.1.hook_resid_post"


def tiny_vit() -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                              num_classes=5).eval()  # fmt: skip
    with torch.no_grad():
        model.head.weight.normal_(std=0.5)
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model = tiny_vit()
    images = torch.randn(24, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    folder = tmp_path_factory.mktemp("features")
    store = vk.cache_activations(model, images, folder / "s", layers=[-1], tokens="all",
                                 progress=False)  # fmt: skip
    sae = vk.train_sae(store, expansion=2, k=6, tokens=20 * len(store), batch_size=128,
                       progress=False)  # fmt: skip
    return model, images, store, sae


def all_latents(sae, store) -> torch.Tensor:
    with torch.no_grad():
        return sae.encode(store.rows(0, len(store)))  # (rows, latents)


def test_statistics_and_tops_equal_brute_force(trained, monkeypatch):
    model, images, store, sae = trained
    monkeypatch.setattr(latent_stats, "BATCH_BYTES", 5 * 17 * sae.latents * 4)  # 5 images
    found = features(sae, store, top=4, progress=False)
    z = all_latents(sae, store)
    torch.testing.assert_close(found.density, (z > 0).float().mean(0))
    torch.testing.assert_close(found.max_activation, z.max(0).values)
    fired = (z > 0).sum(0).clamp_min(1)
    torch.testing.assert_close(found.mean_activation, z.sum(0) / fired)
    torch.testing.assert_close(found.top_values, z.T.topk(4, dim=1).values)
    per_image = z.view(24, 17, -1).amax(1)
    torch.testing.assert_close(found.image_max, per_image)
    torch.testing.assert_close(found.image_values, per_image.T.topk(4, dim=1).values)
    latent = int(found.by_density()[0])
    assert found.density[latent] == found.density.max()
    for image, token, value in found.top_patches(latent):
        assert z[image * 17 + token, latent] == pytest.approx(value)
    for image, value in found.top_images(latent, 2):
        assert per_image[image, latent] == pytest.approx(value)
    assert "alive" in repr(found)


def test_heatmap_and_token_lookup_read_the_stored_image(trained):
    model, images, store, sae = trained
    found = features(sae, store, progress=False)
    z = all_latents(sae, store).view(24, 17, -1)
    heat = found.heatmap([0, 3], image=5)
    assert heat.shape == (2, 4, 4)
    torch.testing.assert_close(heat, z[5, 1:, [0, 3]].T.reshape(2, 4, 4))
    at = found.at_token(5, 7, count=3)
    expected = z[5, 7].topk(3)
    assert [i for i, _ in at] == [int(i) for i, v in zip(expected.indices, expected.values,
                                                          strict=True) if v > 0]  # fmt: skip
    with pytest.raises(IndexError, match="image 99 out of range"):
        found.heatmap(0, 99)


def test_random_patches_leave_the_others_unknown(tmp_path):
    model = tiny_vit()
    images = torch.randn(6, 3, 32, 32)
    store = vk.cache_activations(model, images, tmp_path / "s", tokens=3, progress=False)
    sae = vk.train_sae(store, expansion=1, k=2, batch_size=18, tokens=36, progress=False)
    heat = features(sae, store, progress=False).heatmap(0, 2)
    assert int(torch.isfinite(heat).sum()) == 3
    with pytest.raises(ValueError, match="Token 0 of image 2 is not in the store"):
        features(sae, store, progress=False).at_token(2, 0)


def test_class_detectors_equal_scikit_learn(trained):
    model, images, store, sae = trained
    found = features(sae, store, progress=False)
    labels = torch.arange(24) % 3
    detectors = found.class_detectors(labels)
    assert detectors.auc.shape == (3, sae.latents)
    for cls in range(3):
        for latent in (0, 5, 11):
            want = roc_auc_score((labels == cls).numpy(), found.image_max[:, latent].numpy())
            assert float(detectors.auc[cls, latent]) == pytest.approx(want, abs=1e-6)
    best = detectors.best()
    assert [c for c, _, _ in best] == [0, 1, 2]
    assert detectors.detected(0.0) == 3
    with pytest.raises(ValueError, match=r"labels must be \(24,\)"):
        found.class_detectors(labels[:5])


def test_mask_share_equals_brute_force(trained):
    model, images, store, sae = trained
    found = features(sae, store, progress=False)
    masks = torch.zeros(24, 32, 32, dtype=torch.bool)
    masks[:, :16, :8] = True  # patches (0,0), (1,0): whole; (0,1), (1,1): none
    masks[:, 16:18, :] = True  # row 2: a quarter of each patch
    share = found.mask_share(masks)
    z = all_latents(sae, store).view(24, 17, -1)[:, 1:]  # patches only
    on = torch.zeros(4, 4, dtype=torch.bool)
    on[0:2, 0] = True
    on[2, :] = True
    inside, total = z[:, on.flatten()].sum((0, 1)), z.sum((0, 1))
    expected = torch.where(total > 0, inside / total, torch.nan)
    torch.testing.assert_close(share.share, expected, equal_nan=True)
    assert share.chance == pytest.approx(6 / 16)


def test_logit_effects_equal_the_head_by_hand(trained):
    """A class-token ViT: the final LayerNorm, frozen at each image's class token (centring,
    then dividing by its scale), then the head; the patches reach no logit directly."""
    model, images, store, sae = trained
    x = images[:5]
    effects = logit_effects(model, sae, x)
    _, cache = vk.HookedModel(model).run_with_cache(x, names=LAST)
    cls = cache[LAST][:, 0]
    sigma = (cls.var(-1, unbiased=False) + model.norm.eps).sqrt()  # (B,)
    directions = sae.W_dec.detach() / sae.input_scale
    directions = directions - directions.mean(1, keepdim=True)  # the norm's centring
    per_image = (model.head.weight * model.norm.weight) @ directions.T  # (K, latents)
    expected = per_image * (1 / sigma).mean()
    torch.testing.assert_close(effects.effects, expected, rtol=1e-4, atol=1e-5)
    latent = int(effects.effects[2].argmax())
    assert effects.by_class(2)[0] == latent and effects.top_classes(latent, 1)[0][0] == 2
    some = logit_effects(model, sae, x, classes=[4, 2])
    torch.testing.assert_close(some.effects, expected[[4, 2]], rtol=1e-4, atol=1e-5)
    assert some.by_class(2)[0] == latent and some.top_classes(latent, 1)[0][0] in (2, 4)
    with pytest.raises(ValueError, match="Class 0 was not among the classes measured"):
        some.by_class(0)
    with pytest.raises(ValueError, match=r"classes must be indices in 0..4"):
        logit_effects(model, sae, x, classes=[5])


def test_logit_effects_at_once_equal_a_backward_per_class(trained, monkeypatch):
    """Every class through the head made linear in one product equals the head's gradient
    taken one class at a time (the path kept for heads that do not read a first few tokens)."""
    import vizkit.sae.effects as effects_module

    model, images, store, sae = trained
    x = images[:6]
    at_once = logit_effects(model, sae, x)
    monkeypatch.setattr(effects_module, "first_tokens_head", lambda *args: None)
    per_class = logit_effects(model, sae, x)
    scale = float(per_class.effects.abs().max())
    assert scale > 0
    torch.testing.assert_close(at_once.effects, per_class.effects, rtol=0, atol=1e-5 * scale)


def manual(model, sae, x, change):
    """Logits with ``change(tokens (B, N, C)) -> new tokens`` applied to the last block's
    output by a plain torch forward hook."""
    handle = model.blocks[1].register_forward_hook(lambda m, a, out: change(out))
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


def test_ablate_and_steer_equal_a_plain_hook(trained):
    model, images, store, sae = trained
    x = images[:6]
    before = state(model)
    latent = int(features(sae, store, progress=False).by_density()[0])
    direction = (sae.W_dec[latent] / sae.input_scale).detach()

    def without(tokens):
        with torch.no_grad():
            z = sae.encode(tokens)[..., latent]
        return tokens - z[..., None] * direction

    result = ablate(model, sae, x, latent, batch_size=4)
    torch.testing.assert_close(result.edited, manual(model, sae, x, without), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(result.clean, model(x))
    steered = steer(model, sae, x, latent, strength=3.0)
    torch.testing.assert_close(steered.edited, manual(model, sae, x, lambda t: t + 3 * direction),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    nothing = steer(model, sae, x, latent, strength=0.0)
    assert torch.equal(nothing.edited, nothing.clean)
    assert "top-1 class changed on" in repr(steered)
    assert steered.probability_change().shape == (6, 5)
    after = state(model)
    assert after[:2] == before[:2]
    with pytest.raises(ValueError, match=r"latents must be an int in \[0, 383\]; got 384"):
        ablate(model, sae, x, [384])


def test_effects_are_refused_where_undefined(trained, tmp_path):
    model, images, store, sae = trained
    inner = vk.cache_activations(model, images, tmp_path / "s", layers="blocks.1.mlp.fc1.hook_out",
                                 progress=False)  # fmt: skip
    mlp = vk.train_sae(inner, expansion=1, k=4, batch_size=128, tokens=1280, progress=False)
    with pytest.raises(ValueError, match="not a block's input or output"):
        logit_effects(model, mlp, images[:2])
    ablate(model, mlp, images[:2], 0)  # the path through the model is defined anywhere


def test_a_backbone_is_edited_and_compared_by_its_embedding(tmp_path):
    torch.manual_seed(0)
    backbone = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                                 num_classes=0).eval()  # fmt: skip
    images = torch.randn(8, 3, 32, 32)
    store = vk.cache_activations(backbone, images, tmp_path / "s", tokens="all", progress=False)
    sae = vk.train_sae(store, expansion=1, k=4, batch_size=64, tokens=640, progress=False)
    result = steer(backbone, sae, images[:3], 0, 2.0)
    assert result.output == "embedding" and result.clean.shape == (3, 192)
    with torch.no_grad():
        torch.testing.assert_close(result.clean, backbone(images[:3]))
    assert "cosine of the edited to the clean embedding" in repr(result)
    with pytest.raises(ValueError, match="backbone: its outputs are embeddings"):
        result.mean_probability(0)
    with pytest.raises(ValueError, match="is a backbone"):
        logit_effects(backbone, sae, images[:2])


def test_latent_maps_of_a_forward_equal_the_stored_heat_maps(trained):
    model, images, store, sae = trained
    found = features(sae, store, progress=False)
    maps = vk.sae.latent_maps(model, sae, images[3:5], latents=[2, 7])
    assert maps.shape == (2, 2, 4, 4)
    for b, image in enumerate((3, 4)):
        torch.testing.assert_close(maps[b], found.heatmap([2, 7], image), rtol=1e-5, atol=1e-5)


def test_latent_maps_need_patches(tmp_path):
    model = tiny_vit()
    images = torch.randn(6, 3, 32, 32)
    store = vk.cache_activations(model, images, tmp_path / "s", tokens="class", progress=False)
    sae = vk.train_sae(store, expansion=1, k=2, batch_size=6, tokens=12, progress=False)
    with pytest.raises(ValueError, match="not on patches"):
        vk.sae.latent_maps(model, sae, images[:2])


def test_effects_and_run_are_the_logit_effects_and_the_clean_run(trained):
    """One forward for both: the logit effects of `logit_effects`, the model's outputs, the
    activation at the autoencoder's layer and the path from there, proved."""
    model, images, _, sae = trained
    x = images[:8]
    effects, run = effects_and_run(model, sae, x)
    want = logit_effects(model, sae, x).effects
    torch.testing.assert_close(effects.effects, want, rtol=0, atol=1e-5 * float(want.abs().max()))
    hm = vk.HookedModel(model)
    with torch.no_grad():
        logits, cache = hm.run_with_cache(x, LAST)
    torch.testing.assert_close(run.output, logits, rtol=0, atol=1e-5 * float(logits.abs().max()))
    assert torch.equal(run.stream, cache[LAST])
    assert run.why == "" and run.resumed is not None
