"""Video transformers (transformers' VideoMAE and ViViT, random-init small configs, nothing
downloaded): clips (B, T, C, H, W) laid out as T' x gh x gw patch tokens, attention equal to
each model's own (``output_attentions=True`` under eager attention), rollout and Grad-CAM over
space-time equal to a hand computation, the input contract's refusals (with fixes that work), and
every analysis that does not take videos yet refusing them by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vizkit as vk
from vizkit.analysis import attention_stats as stats
from vizkit.hooks.video import VIDEO_ANALYSES

transformers = pytest.importorskip("transformers")

SMALL = {"image_size": 32, "num_frames": 4, "hidden_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 2, "intermediate_size": 64, "num_labels": 5}  # fmt: skip
PREFIX = {"videomae": 0, "vivit": 1}
KINDS = list(PREFIX)


def build(kind: str) -> nn.Module:
    """A small random-init video classifier of ``kind``: 4 frames of 32 x 32, tubelets of
    2 x 8 x 8 (2 token frames of 4 x 4 patches)."""
    torch.manual_seed(0)
    if kind == "videomae":
        config = transformers.VideoMAEConfig(patch_size=8, tubelet_size=2, **SMALL)
        return transformers.VideoMAEForVideoClassification(config).eval()
    config = transformers.VivitConfig(tubelet_size=[2, 8, 8], **SMALL)
    return transformers.VivitForVideoClassification(config).eval()


def clips(batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 4, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def own_attentions(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(L, B, H, N, N): the model's own maps, under eager attention (switched back after)."""
    before = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            return torch.stack(model(x, output_attentions=True).attentions)
    finally:
        model.config._attn_implementation = before


@pytest.mark.parametrize("kind", KINDS)
def test_layout_and_attention_equal_the_models_own(kind):
    model, x = build(kind), clips()
    result = vk.attention(model, x)
    layout = result.layout
    assert (layout.frames, layout.grid, layout.num_prefix_tokens) == ((2, (4, 4), PREFIX[kind]))
    assert layout.class_token == (kind == "vivit")
    assert result.patterns.shape == (2, 2, 2, PREFIX[kind] + 32, PREFIX[kind] + 32)
    torch.testing.assert_close(result.patterns, own_attentions(model, x), rtol=1e-5, atol=1e-6)
    assert model.config._attn_implementation == "sdpa"  # switched back after the call
    # a patch by (frame, row, col): token frame-major, as the Conv3d flattens its output
    row = result.row((1, 2, 3))
    index = PREFIX[kind] + 1 * 16 + 2 * 4 + 3
    torch.testing.assert_close(
        row, result.patterns[:, :, :, index, PREFIX[kind] :].unflatten(-1, (2, 4, 4))
    )
    with pytest.raises(ValueError, match=r"\(frame, row, col\) with frame 0..1"):
        result.row((2, 0, 0))


def test_frame_distance_and_spatial_statistics_by_hand():
    layout = vk.TokenLayout(0, (2, 2), frames=2)
    n = layout.num_patches
    within = torch.eye(n)[None]  # every patch attends to itself
    across = torch.roll(torch.eye(n), 4, dims=1)[None]  # to its own position in the other frame
    assert float(stats.mean_frame_distance(within, layout)) == 0
    assert float(stats.mean_frame_distance(across, layout)) == 1
    assert float(stats.mean_attention_distance(across, layout)) == 0  # same position
    assert float(stats.self_mass(across, layout)) == 0
    result = vk.attention(build("videomae"), clips(1))
    values = result.stats()
    assert set(values) >= {"distance_frames", "distance_patches", "locality", "self_mass"}
    assert all(v.shape == (2, 1, 2) for v in values.values())
    assert bool((values["distance_frames"] >= 0).all() & (values["distance_frames"] <= 1).all())


def _rollout_by_hand(patterns: torch.Tensor, prefix: int) -> torch.Tensor:
    """(B, T', gh, gw): heads averaged, identity added, rows renormalized, multiplied over
    the layers; the class token's row (ViViT) or the mean over the patch queries (VideoMAE)."""
    joint = None
    for layer in patterns:  # (B, H, N, N)
        step = layer.double().mean(1) + torch.eye(layer.shape[-1], dtype=torch.float64)
        step = step / step.sum(-1, keepdim=True)
        joint = step if joint is None else step @ joint
    rows = joint[:, 0, prefix:] if prefix else joint[:, :, prefix:].mean(1)
    return rows.float().unflatten(-1, (2, 4, 4))


@pytest.mark.parametrize("kind", KINDS)
def test_rollout_over_space_time_by_hand(kind):
    model, x = build(kind), clips()
    result = vk.rollout(model, x)
    assert result.maps.shape == (2, 2, 4, 4) and result.frames == 2
    expected = _rollout_by_hand(own_attentions(model, x), PREFIX[kind])
    torch.testing.assert_close(result.maps, expected, rtol=1e-4, atol=1e-6)
    up = result.upsample()  # each token frame upsampled on its own
    assert up.shape == (2, 2, 32, 32)
    frame = F.interpolate(result.maps[:, 1:2], size=(32, 32), mode="bilinear")[:, 0]
    torch.testing.assert_close(up[:, 1], frame)


def _block_output(model: nn.Module, kind: str) -> nn.Module:
    return model.videomae.encoder.layer[0] if kind == "videomae" else model.vivit.layers[0]


@pytest.mark.parametrize("kind", KINDS)
def test_gradcam_over_space_time_by_hand(kind):
    """Grad-CAM of the first block's output tokens: channel weights = mean gradient over
    every space-time patch, relu(sum_c w_c A_c) on each patch, frame-major."""
    model, x = build(kind), clips()
    layer = f"{'videomae.encoder.layer' if kind == 'videomae' else 'vivit.layers'}.0"
    result = vk.gradcam(model, x, target=3, layer=f"{layer}.hook_resid_post")
    assert result.maps.shape == (2, 2, 4, 4)
    seen = {}
    handle = _block_output(model, kind).register_forward_hook(
        lambda module, args, out: seen.setdefault(
            "tokens", out[0] if isinstance(out, tuple) else out
        )
    )
    try:
        logits = model(x).logits
    finally:
        handle.remove()
    tokens = seen["tokens"][:, PREFIX[kind] :]  # (B, 32, C) patches
    (grad,) = torch.autograd.grad(logits[:, 3].sum(), seen["tokens"])
    weights = grad[:, PREFIX[kind] :].mean(1, keepdim=True)
    expected = (tokens * weights).sum(-1).clamp_min(0).unflatten(-1, (2, 4, 4))
    torch.testing.assert_close(result.maps, expected.detach(), rtol=1e-4, atol=1e-7)
    assert result.targets.tolist() == [3, 3]
    for method in ("gradcam_pp", "xgradcam", "layercam", "hirescam", "eigencam"):
        assert getattr(vk, method)(model, x, layer=-1).maps.shape == (2, 2, 4, 4)


def test_input_contract_refuses_what_is_not_a_clip_with_a_fix_that_works():
    model, x = build("videomae"), clips()
    with pytest.raises(ValueError, match=r"takes videos \(B, 4, 3, 32, 32\).*x\[None\]"):
        vk.attention(model, x[0])
    vk.attention(model, x[0][None])  # the fix for one clip
    with pytest.raises(ValueError, match=r"got \(3, 32, 32\)"):
        vk.attention(model, x[0, 0])
    with pytest.raises(ValueError, match=r"channels-first.*x\.permute\(0, 2, 1, 3, 4\)"):
        vk.attention(model, x.permute(0, 2, 1, 3, 4))
    vk.attention(model, x.permute(0, 2, 1, 3, 4).permute(0, 2, 1, 3, 4))
    with pytest.raises(ValueError, match="Sample 4 frames"):
        vk.attention(model, x[:, :2])
    with pytest.raises(ValueError, match="Resize the frames to 32x32"):
        vk.attention(model, x[..., :16, :16])
    image_model = vk.create_model("test_vit")
    with pytest.raises(ValueError, match="This model takes images"):
        vk.attention(image_model, torch.randn(1, 2, 3, 64, 64))


def test_analyses_without_a_frame_axis_refuse_videos_by_name():
    model, x = build("vivit"), clips()
    assert {"attention", "rollout", "gradcam", "eigencam"} <= VIDEO_ANALYSES
    for call in (
        lambda: vk.class_attention(model, x),
        lambda: vk.activation_patching(model, x, x.flip(0), target=0, progress=False),
    ):
        with pytest.raises(ValueError, match=r"does not take videos yet.*attention, .*rollout"):
            call()
    hm = vk.HookedModel(model)  # the hook API itself takes the model's own input
    _, cache = hm.run_with_cache(x, names="*.hook_resid_post")
    assert len(cache) == 2 and not any(m._forward_hooks for m in model.modules())


def test_video_saliency_results_keep_the_frame_axis():
    layout = vk.TokenLayout(1, (4, 4), True, frames=2)
    maps = torch.rand(2, 2, 4, 4)
    result = vk.SaliencyResult(maps, "m", (32, 32), layout=layout)
    assert result.frames == 2
    assert torch.equal(vk.SaliencyResult.from_dict(result.to_dict()).maps, maps)
    assert vk.SaliencyResult.from_dict(result.to_dict()).layout == layout
    with pytest.raises(ValueError, match=r"a video's \(B, 2, h, w\)"):
        vk.SaliencyResult(maps[:, 0], "m", (32, 32), layout=layout)
    with pytest.raises(ValueError, match=r"a video's \(B, 2, h, w\); got shape \(2, 3, 4, 4\)"):
        vk.SaliencyResult(torch.rand(2, 3, 4, 4), "m", (32, 32), layout=layout)


def test_frame_shares_by_hand():
    layout = vk.TokenLayout(0, (2, 2), frames=2)
    maps = torch.tensor([[[[1.0, -1.0], [0.0, 0.0]], [[2.0, 0.0], [0.0, 0.0]]]])
    result = vk.SaliencyResult(maps, "m", (16, 16), layout=layout)
    torch.testing.assert_close(result.frame_shares(), torch.tensor([[0.5, 0.5]]))
    zero = vk.SaliencyResult(torch.zeros(1, 2, 2, 2), "m", (16, 16), layout=layout)
    assert zero.frame_shares().tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="maps are of images"):
        vk.SaliencyResult(torch.rand(1, 2, 2), "m", (16, 16)).frame_shares()


def test_metrics_refuse_a_videos_maps_for_images_rather_than_score_one_frame():
    layout = vk.TokenLayout(1, (4, 4), True, frames=2)
    result = vk.SaliencyResult(torch.rand(2, 2, 4, 4), "m", (32, 32), layout=layout)
    model = vk.create_model("test_vit")
    with pytest.raises(
        ValueError, match=r"video's \(B, 2, h, w\), but .* against images \(B, C, H, W\)"
    ):
        vk.metrics.deletion(model, torch.randn(2, 3, 32, 32), result, steps=2, progress=False)


def vjepa2() -> nn.Module:
    """A small random-init V-JEPA 2 classifier: 4 frames of 32 x 32 in 2 x 8 x 8 tubelets, two
    encoder blocks, an attentive pooler with one self-attention layer."""
    torch.manual_seed(0)
    config = transformers.VJEPA2Config(
        crop_size=32, patch_size=8, frames_per_clip=4, tubelet_size=2, hidden_size=32,
        num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, pred_hidden_size=32,
        pred_num_hidden_layers=1, pred_num_attention_heads=2, num_pooler_layers=1, num_labels=5,
    )  # fmt: skip
    return transformers.VJEPA2ForVideoClassification(config).eval()


def _softmax_map(attn: nn.Module, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """(B, H, Nq, N) softmax(q k^T / sqrt(d)) of the pooler's attention projections."""
    heads = attn.num_heads
    q = attn.q_proj(queries).unflatten(-1, (heads, -1)).transpose(1, 2)
    k = attn.k_proj(keys).unflatten(-1, (heads, -1)).transpose(1, 2)
    return (q @ k.transpose(-2, -1) * attn.scale).softmax(-1)


def test_vjepa2_maps_equal_its_own_and_rollout_follows_its_pooler():
    """The encoder's maps equal `output_attentions`; the pooler's self-attention and its
    query's cross-attention equal softmax(q k^T / sqrt(d)) of its own projections; rollout is
    the pooling map times the joint attention of every self-attention layer (by hand)."""
    model, x = vjepa2(), clips()
    result = vk.attention(model, x)
    assert result.layout.frames == 2 and result.layout.num_prefix_tokens == 0
    assert result.patterns.shape == (3, 2, 2, 32, 32)  # 2 encoder blocks, 1 pooler layer
    torch.testing.assert_close(result.patterns[:2], own_attentions(model, x), rtol=1e-5, atol=1e-6)
    pooler, seen = model.pooler, {}
    handle = pooler.self_attention_layers[0].register_forward_hook(
        lambda module, args, out: seen.update(inputs=args[0], outputs=out[0])
    )
    try:
        with torch.no_grad():
            model(x)
            layer = pooler.self_attention_layers[0]
            own_self = _softmax_map(layer.self_attn, *[layer.layer_norm1(seen["inputs"])] * 2)
            queries = pooler.query_tokens.expand(len(x), -1, -1)
            keys = pooler.cross_attention_layer.layer_norm1(seen["outputs"])
            own_pool = _softmax_map(pooler.cross_attention_layer.cross_attn, queries, keys)
    finally:
        handle.remove()
    torch.testing.assert_close(result.patterns[2], own_self, rtol=1e-5, atol=1e-6)
    _, cache = vk.HookedModel(model).run_with_cache(x, names="*cross_attn.hook_pattern")
    torch.testing.assert_close(
        cache["pooler.cross_attention_layer.cross_attn.hook_pattern"], own_pool
    )
    joint = None
    for layer in result.patterns.double():
        step = layer.mean(1) + torch.eye(32, dtype=torch.float64)
        step = step / step.sum(-1, keepdim=True)
        joint = step if joint is None else step @ joint
    expected = (own_pool.double().mean(1) @ joint)[:, 0].float().unflatten(-1, (2, 4, 4))
    torch.testing.assert_close(vk.rollout(model, x).maps, expected, rtol=1e-4, atol=1e-6)
    for method in ("gradcam", "attnlrp", "legrad", "integrated_gradients"):
        assert getattr(vk, method)(model, x, target=1).frames in (2, 4)
