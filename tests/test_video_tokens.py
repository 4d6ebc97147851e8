"""Token norms, token PCA and residual-norm ratios over a video model's clips (transformers'
ViViT and TimeSformer, random-init small configs, nothing downloaded): each result equal to a
hand computation from the model's own hidden states (TimeSformer's space-major stream read
frame-major), the patch axes laid out (T', gh, gw), and the figures drawing each token frame of a
clip in its own labelled panel (or refusing frames that are not the clips')."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
import torch
from torch import nn

import vizkit as vk

transformers = pytest.importorskip("transformers")

import test_timesformer as timesformer  # noqa: E402
import test_video_families as families  # noqa: E402
from test_figure_lint import faults  # noqa: E402

KINDS = ["vivit", "timesformer"]
TOKEN_FRAMES = {"vivit": 2, "timesformer": 4}  # ViViT's tubelets span 2 of the 4 frames
GRID = (4, 4)


def build(kind: str, attention_type: str = "divided_space_time") -> nn.Module:
    if kind == "vivit":
        return families.build("vivit")
    return timesformer.build(attention_type)


def own_blocks(model: nn.Module, x: torch.Tensor, kind: str) -> list[torch.Tensor]:
    """The stream before the first block and after each, (B, 1 + T'·gh·gw, C) as the model
    returns it (``output_hidden_states``), frame-major."""
    with torch.no_grad():
        states = model(x, output_hidden_states=True).hidden_states
    return [timesformer.frame_major(s) if kind == "timesformer" else s for s in states]


@pytest.mark.parametrize("kind", KINDS)
def test_token_norms_of_clips_are_the_norms_of_the_models_own_tokens(kind):
    model, x = build(kind), timesformer.clips()
    frames = TOKEN_FRAMES[kind]
    result = vk.token_norms(model, x)
    states = torch.stack(own_blocks(model, x, kind)[1:], 1)  # (B, L, 1 + T'·Np', C)
    norms = states.norm(dim=-1)
    assert result.patches.shape == (2, 2, frames, *GRID) and result.prefix.shape == (2, 2, 1)
    assert result.layout.frames == frames
    torch.testing.assert_close(result.prefix, norms[..., :1])
    torch.testing.assert_close(result.patches, norms[..., 1:].unflatten(-1, (frames, *GRID)))
    # patch (frame 1, row 2, col 3) of clip 1, last layer: token 1 + 1·16 + 2·4 + 3
    torch.testing.assert_close(result.patches[1, -1, 1, 2, 3], states[1, -1, 1 + 16 + 11].norm())
    cut = float(norms[..., 1:].median())  # about half the patches above it
    flags = norms[..., 1:] > cut  # (B, L, T'·Np')
    torch.testing.assert_close(result.high_norm_fraction(cut), flags.float().mean((0, 2)))
    assert 0.3 < float(result.high_norm_fraction(cut).mean()) < 0.7
    # the default cut is per clip, over all of its frames: 4x the clip's median flags none here
    median = norms[..., 1:].median(-1, keepdim=True).values
    assert not (norms[..., 1:] > 4 * median).any() and not result.high_norm().any()


def _pca_by_hand(tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, C) float64 tokens -> ((C, k) the top-k eigenvectors of their covariance, each
    signed so that its largest loading is positive; (k,) their share of the variance)."""
    centred = tokens - tokens.mean(0)
    values, vectors = torch.linalg.eigh(centred.T @ centred)  # ascending
    top = vectors[:, -k:].flip(-1)
    top = top * top.gather(0, top.abs().argmax(0, keepdim=True)).sign()
    return top, values.flip(0)[:k] / values.sum()


@pytest.mark.parametrize("kind", KINDS)
def test_token_pca_of_clips_fits_every_space_time_patch_token(kind):
    model, x = build(kind), timesformer.clips()
    frames = TOKEN_FRAMES[kind]
    result = vk.token_pca(model, x, components=3)
    patches = own_blocks(model, x, kind)[-1][:, 1:].double()  # (B, T'·Np', C)
    directions, shares = _pca_by_hand(patches.flatten(0, 1), 3)
    expected = (patches - patches.flatten(0, 1).mean(0)) @ directions  # (B, T'·Np', 3)
    assert result.fitted == 2 * frames * 16
    assert result.projections.shape == (2, 3, frames, *GRID)
    torch.testing.assert_close(
        result.projections, expected.transpose(1, 2).unflatten(-1, (frames, *GRID)).float(),
        rtol=1e-4, atol=1e-5,
    )  # fmt: skip
    torch.testing.assert_close(result.explained_variance_ratio, shares.float())
    rgb = result.rgb()
    assert rgb.shape == (2, frames, *GRID, 3)
    every = (0, 1, 2, 3)  # each colour spans [0, 1] over the batch
    assert rgb.amin(every).tolist() == [0, 0, 0] and rgb.amax(every).tolist() == [1, 1, 1]
    # fitted on token frame 0 only: its tokens' components, every token projected
    first = torch.zeros(2, frames, *GRID, dtype=torch.bool)
    first[:, 0] = True
    on_first = vk.token_pca(model, x, components=2, fit_on=first)
    directions, _ = _pca_by_hand(patches[:, :16].flatten(0, 1), 2)
    mean = patches[:, :16].flatten(0, 1).mean(0)
    expected = ((patches - mean) @ directions).transpose(1, 2).unflatten(-1, (frames, *GRID))
    assert on_first.fitted == 2 * 16
    torch.testing.assert_close(on_first.projections, expected.float(), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=rf"\(2, {frames}, 4, 4\) \(clips, token frames"):
        vk.token_pca(model, x, fit_on=first[:, 0])


def _branch_hook(model: nn.Module, kind: str, layer: int, seen: dict):
    """A plain torch hook keeping block ``layer``'s MLP addition (its MLP module's output;
    the dropout and drop-path after it are off in eval mode)."""
    if kind == "vivit":
        mlp = model.vivit.layers[layer].mlp
    else:
        mlp = model.timesformer.encoder.layer[layer].output
    return mlp.register_forward_hook(lambda module, args, out: seen.update({layer: out}))


@pytest.mark.parametrize(
    ("kind", "attention_type"),
    [("vivit", ""), ("timesformer", "divided_space_time"), ("timesformer", "joint_space_time")],
)
def test_residual_ratios_of_clips_by_hand(kind, attention_type):
    """r^SA = ||x' - x|| / ||x||, r^FFN = ||mlp|| / ||x'|| per clip over all its tokens (x the
    block's input, x' = its output - the MLP's addition: for a divided block the temporal and
    spatial steps together), averaged over the clips."""
    model, x = build(kind, attention_type), timesformer.clips()
    seen: dict[int, torch.Tensor] = {}
    handles = [_branch_hook(model, kind, layer, seen) for layer in (0, 1)]
    try:
        with torch.no_grad():
            states = model(x, output_hidden_states=True).hidden_states
    finally:
        for handle in handles:
            handle.remove()
    result = vk.residual_ratios(model, x)
    assert result.layout.frames == TOKEN_FRAMES[kind] and len(result.layers) == 2

    def ratio(top: torch.Tensor, bottom: torch.Tensor) -> torch.Tensor:  # per clip, then mean
        squares = [t.double().square().sum((1, 2)) for t in (top, bottom)]
        return (squares[0] / squares[1]).sqrt().mean()

    for layer in (0, 1):
        mlp = seen[layer]
        mid = states[layer + 1] - mlp
        attention = mid - states[layer]
        expected = (ratio(attention, states[layer]), ratio(mlp, mid))
        torch.testing.assert_close(result.attn[layer], expected[0], rtol=1e-4, atol=0)
        torch.testing.assert_close(result.mlp[layer], expected[1], rtol=1e-4, atol=0)
    assert bool((result.attn > 1e-3).all() & (result.mlp > 1e-3).all())
    figure = vk.viz.residual_ratio_curves(result)  # per layer: nothing drawn per token
    assert list(figure.data[0].y) == result.attn.tolist() and not faults(figure)


def _panels(fig: go.Figure, kind: type) -> list:
    return [t for t in fig.data if isinstance(t, kind)]


def _titles(fig: go.Figure) -> list[str]:
    return [a.text for a in fig.layout.annotations]


@pytest.mark.parametrize("kind", KINDS)
def test_token_norm_figure_draws_each_token_frame_of_each_clip(kind):
    """One panel per (clip, token frame), the panel of clip 1's token frame t holding exactly
    its norms, titled by the frames it spans; the histogram counts every token of the layer."""
    model, x = build(kind), timesformer.clips()
    frames = TOKEN_FRAMES[kind]
    result = vk.token_norms(model, x)
    shown = vk.viz.display_images(x, model)  # (B, T, H, W, 3)
    fig = vk.viz.token_norms_figure(result, shown)
    maps = _panels(fig, go.Heatmap)
    assert len(maps) == 2 * frames
    for t in range(frames):
        assert torch.equal(torch.as_tensor(maps[frames + t].z), result.patches[1, -1, t])
    labels = ["frame 0", "frame 3"] if kind == "timesformer" else ["frames 0-1", "frames 2-3"]
    titles = set(_titles(fig))
    assert {f"clip 0, {labels[0]}", f"clip 1, {labels[1]}"} <= titles
    assert any(t.startswith("all tokens: ") and "patch" in t for t in titles)
    bars = _panels(fig, go.Bar)
    assert sum(sum(b.y) for b in bars) == result.patches[:, -1].numel() + 2  # + class tokens
    assert f"2 clips of {frames} token frames" in fig.layout.title.text
    assert not faults(fig)
    plain = vk.viz.token_norms_figure(result, count=1)  # without frames: token frames named
    assert len(_panels(plain, go.Heatmap)) == frames and "clip 0, token frame 0" in _titles(plain)
    assert not faults(plain)
    with pytest.raises(ValueError, match=r"clips' frames as \(B, T, H, W, 3\)"):
        vk.viz.token_norms_figure(result, shown[:, 0])  # one frame of each clip: not a clip


@pytest.mark.parametrize("kind", KINDS)
def test_token_pca_figure_draws_each_token_frame_of_each_clip(kind):
    model, x = build(kind), timesformer.clips()
    frames = TOKEN_FRAMES[kind]
    result = vk.token_pca(model, x)
    shown = vk.viz.display_images(x, model)
    fig = vk.viz.token_pca_figure(result, shown, count=2)
    colours = [t for t in _panels(fig, go.Image) if t.z is not None]  # photos carry a PNG
    assert len(colours) == 2 * frames and len(_panels(fig, go.Image)) == 4 * frames
    expected = (result.rgb() * 255).round().byte()
    for t in range(frames):
        assert torch.equal(torch.as_tensor(colours[frames + t].z), expected[1, t])
    assert "clip 1, frame 3" in _titles(fig) or "clip 1, frames 2-3" in _titles(fig)
    assert f"over 2 clips of {frames} token frames" in fig.layout.title.text
    assert not faults(fig)
    with pytest.raises(ValueError, match=r"clips' frames as \(B, T, H, W, 3\)"):
        vk.viz.token_pca_figure(result, shown[:, :3])  # 3 frames: no whole tubelets
