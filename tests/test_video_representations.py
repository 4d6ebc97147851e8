"""CKA, the activation store and sparse autoencoders over a video model's space-time tokens
(transformers' ViViT and TimeSformer, random-init small configs): CKA equal to linear CKA of the
models' own hidden states, stored rows equal to them token by token (TimeSformer's space-major
stream read frame-major), heat maps over (T', gh, gw) equal from the store and from a forward,
and an autoencoder's edit reaching the tokens it names."""

from __future__ import annotations

import pytest
import torch

import vizkit as vk

transformers = pytest.importorskip("transformers")

import test_timesformer as timesformer  # noqa: E402
import test_video_families as families  # noqa: E402


def _models() -> dict:
    return {"vivit": families.build("vivit"), "timesformer": timesformer.build()}


def _own_blocks(model, x: torch.Tensor, kind: str) -> list[torch.Tensor]:
    """Each block's output as the model returns it, frame-major."""
    with torch.no_grad():
        states = model(x, output_hidden_states=True).hidden_states[1:]
    return [timesformer.frame_major(s) if kind == "timesformer" else s for s in states]


def _linear_cka(a: torch.Tensor, b: torch.Tensor) -> float:
    """Linear CKA of (n, p) and (n, q) features (Kornblith et al. 2019, Eq. 2, centred)."""
    a, b = a.double() - a.double().mean(0), b.double() - b.double().mean(0)
    return float((b.T @ a).norm() ** 2 / ((a.T @ a).norm() * (b.T @ b).norm()))


@pytest.mark.parametrize("kind", ["vivit", "timesformer"])
def test_cka_over_clips_equals_linear_cka_of_the_models_own_states(kind):
    model, x = _models()[kind], timesformer.clips(8)
    result = vk.cka_matrix(model, x, tokens="flatten", unbiased=False, progress=False)
    own = [s.flatten(1) for s in _own_blocks(model, x, kind)]
    assert result.matrix.shape == (2, 2) and result.layout.frames is not None
    assert abs(float(result.matrix[0, 1]) - _linear_cka(own[0], own[1])) < 1e-6
    pooled = vk.cka_matrix(model, x, tokens="mean_patches", unbiased=False, progress=False)
    prefix = 1
    means = [s[:, prefix:].mean(1) for s in _own_blocks(model, x, kind)]
    assert abs(float(pooled.matrix[0, 1]) - _linear_cka(means[0], means[1])) < 1e-6
    with pytest.raises(ValueError, match=r"data must be clips \(B, T, C, H, W\)"):
        vk.cka_matrix(model, x[:, 0], progress=False)


@pytest.mark.parametrize("kind", ["vivit", "timesformer"])
def test_stored_rows_are_the_models_own_tokens_frame_major(kind, tmp_path):
    model, x = _models()[kind], timesformer.clips(5)
    store = vk.cache_activations(model, x, tmp_path / "store", layers=0, tokens="all",
                                 batch_size=2, progress=False)  # fmt: skip
    layout = vk.HookedModel(model).token_layout((32, 32))
    assert (store.frames, store.grid, store.prefix_tokens) == (
        layout.frames, layout.grid, 1)  # fmt: skip
    own = _own_blocks(model, x, kind)[0]
    for image in (0, 4):
        rows, positions = store.image_rows(image)
        assert positions.tolist() == list(range(layout.num_tokens))
        torch.testing.assert_close(rows, own[image], rtol=1e-5, atol=1e-6)


def test_autoencoder_heat_maps_and_edits_over_space_time(tmp_path):
    """TimeSformer, an autoencoder on 6 random patches per clip: its heat map of a stored clip
    (T', gh, gw) equals `latent_maps` of the same clip from a forward, and equals the encoded
    tokens put by hand at (frame, row, col); steering adds the decoder direction at exactly
    every patch token of the model's own stream (an autoencoder of random patches reads every
    patch), the stream put back in the model's order."""
    model, x = timesformer.build(), timesformer.clips(6)
    store = vk.cache_activations(model, x, tmp_path / "store", layers=0, tokens=6,
                                 progress=False)  # fmt: skip
    sae = vk.sae.train_sae(store, expansion=2, k=4, batch_size=12, progress=False)
    everything = vk.cache_activations(model, x, tmp_path / "all", layers=0, tokens="patches",
                                      progress=False)  # fmt: skip
    maps = vk.sae.features(sae, everything, progress=False).heatmap([0, 1, 2], 3)
    assert maps.shape == (3, timesformer.FRAMES, *timesformer.GRID)
    live = vk.sae.latent_maps(model, sae, x[3:4], latents=[0, 1, 2])[0]
    torch.testing.assert_close(maps, live, rtol=1e-4, atol=1e-5)
    tokens = _own_blocks(model, x[3:4], "timesformer")[0][0, 1:]  # (T' gh gw, C) frame-major
    with torch.no_grad():
        by_hand = sae.encode(tokens)[:, :3].T.unflatten(-1, (timesformer.FRAMES, *timesformer.GRID))
    torch.testing.assert_close(maps, by_hand, rtol=1e-4, atol=1e-5)

    steered = vk.sae.steer(model, sae, x, latent=1, strength=3.0).edited
    added = 3.0 * sae.W_dec[1].detach() / sae.input_scale

    def add(module, args, out):
        tokens = out[0].clone()
        tokens[:, 1:] += added
        return (tokens, *out[1:])

    handle = model.timesformer.encoder.layer[0].register_forward_hook(add)
    try:
        with torch.no_grad():
            expected = model(x).logits
    finally:
        handle.remove()
    torch.testing.assert_close(steered, expected, rtol=1e-4, atol=1e-5)
    score = vk.sae.spliced_score(model, sae, (x, torch.arange(6) % 3), progress=False)
    assert score.kl >= 0
