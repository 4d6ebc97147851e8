"""TimeSformer (transformers, random-init small configs, nothing downloaded): divided space-time
attention read at each step's own softmax and put on the clip's tokens exactly (the token map
times the values is the module's own output), the stream's space-major tokens held frame-major
(reads and edits), hook names in forward order, what each branch adds to the stream (summing to
the block's output, edited and differentiated as the model's own tensors), rollout by hand over
both steps, and every analysis that takes videos over (B, T, gh, gw) maps."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import vizkit as vk
from vizkit.hooks.divided import space_major_map, space_major_stream

transformers = pytest.importorskip("transformers")

FRAMES, GRID, HEADS = 4, (4, 4), 2
PATCHES = GRID[0] * GRID[1]


def build(attention_type: str = "divided_space_time") -> nn.Module:
    """4 frames of 32 x 32 in 8 x 8 patches (4 token frames of 4 x 4), 2 blocks of width 32."""
    torch.manual_seed(0)
    config = transformers.TimesformerConfig(
        image_size=32, patch_size=8, num_frames=FRAMES, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=HEADS, intermediate_size=64, num_labels=3,
        attention_type=attention_type,
    )  # fmt: skip
    return transformers.TimesformerForVideoClassification(config).eval()


def clips(batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, FRAMES, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def frame_major(tokens: torch.Tensor) -> torch.Tensor:
    """(B, 1 + Np' T, C) space-major tokens (1 + p T + t) -> frame-major (1 + t Np' + p)."""
    patches = tokens[:, 1:].unflatten(1, (PATCHES, FRAMES)).transpose(1, 2).flatten(1, 2)
    return torch.cat([tokens[:, :1], patches], 1)


def _attention_io(model: nn.Module, x: torch.Tensor, layer: int, which: str) -> tuple:
    """The input and output (context) of block ``layer``'s ``which`` self-attention module."""
    block = model.timesformer.encoder.layer[layer]
    inner = getattr(block, which).attention
    seen = {}
    handle = inner.register_forward_hook(
        lambda module, args, out: seen.update(inputs=args[0], context=out[0])
    )
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return inner, seen["inputs"], seen["context"]


def _values(inner: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """(B', H, n, d) the value vectors of a TimeSformer self-attention on its input."""
    b, n, c = inputs.shape
    qkv = inner.qkv(inputs).reshape(b, n, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4)
    return qkv[2]


def test_hook_names_follow_the_forward_and_the_layout_is_frame_major():
    model, x = build(), clips()
    hm = vk.HookedModel(model)
    names = [n for n in hm.hook_names() if n.endswith(("hook_pattern", "hook_resid_post"))]
    assert names[:3] == [
        "timesformer.encoder.layer.0.temporal_attention.hook_pattern",  # runs first
        "timesformer.encoder.layer.0.attention.hook_pattern",
        "timesformer.encoder.layer.0.hook_resid_post",
    ]
    layout = hm.token_layout((32, 32))
    assert (layout.num_prefix_tokens, layout.grid, layout.frames) == (1, GRID, FRAMES)
    with torch.no_grad():
        own = model(x, output_hidden_states=True).hidden_states
    _, cache = hm.run_with_cache(x, names="*.hook_resid_post")
    for i in range(2):
        torch.testing.assert_close(
            cache[f"timesformer.encoder.layer.{i}.hook_resid_post"], frame_major(own[i + 1])
        )


def test_an_edit_of_a_frame_major_token_reaches_the_right_space_major_token():
    """Zeroing token (frame 2, patch 5) through its name equals zeroing the raw token
    1 + 5 T + 2 with a plain torch hook."""
    model, x = build(), clips()
    hm = vk.HookedModel(model)
    name = "timesformer.encoder.layer.0.hook_resid_post"

    def zero_named(value, *, name):
        value = value.clone()
        value[:, 1 + 2 * PATCHES + 5] = 0
        return value

    with torch.no_grad(), hm.hooks(fwd={name: zero_named}):
        edited = model(x).logits

    def zero_raw(module, args, out):
        tokens = out[0].clone()
        tokens[:, 1 + 5 * FRAMES + 2] = 0
        return (tokens, *out[1:])

    handle = model.timesformer.encoder.layer[0].register_forward_hook(zero_raw)
    try:
        with torch.no_grad():
            expected = model(x).logits
    finally:
        handle.remove()
    torch.testing.assert_close(edited, expected)
    assert not torch.allclose(edited, model(x).logits.detach())
    assert not any(m._forward_hooks for m in model.modules())


BRANCHES = {
    "divided_space_time": ("hook_temporal_out", "hook_spatial_out", "hook_mlp_out"),
    "joint_space_time": ("hook_attn_out", "hook_mlp_out"),
}
STREAM = re.compile(r".*\.layer\.\d\.hook_(resid_\w+|\w+_out)")  # the block's stream names


def loud(attention_type: str) -> nn.Module:
    """`build`, with the projections that write each branch into the stream (``temporal_dense``,
    the spatial or joint ``attention.output.dense``, the MLP's ``output.dense``) 30x larger, so
    that every branch moves the output well above float32 rounding (random-init branches add
    about 1 % of the stream)."""
    model = build(attention_type)
    writers = re.compile(r".*layer\.\d+\.(temporal_dense|attention\.output\.dense|output\.dense)")
    with torch.no_grad():
        for name, module in model.named_modules():
            if writers.fullmatch(name):
                module.weight.mul_(30)
    return model


def _hooks(model: nn.Module) -> list[tuple[int, int]]:
    """Each module's forward and forward-pre hook counts (transformers may hold its own)."""
    return [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()]


@pytest.mark.parametrize("attention_type", list(BRANCHES))
def test_the_branches_add_up_to_each_blocks_output(attention_type):
    """hook_resid_pre + every branch's addition == hook_resid_post, and + the attention's ==
    hook_resid_mid, on every block (frame-major, as the stream's names); the temporal step
    adds nothing to the class token."""
    model, x = loud(attention_type), clips()
    hm = vk.HookedModel(model)
    _, cache = hm.run_with_cache(x, names=STREAM)
    for i in range(2):
        block = f"timesformer.encoder.layer.{i}"
        names = [n.removeprefix(f"{block}.") for n in cache.keys() if n.startswith(f"{block}.")]
        assert names == [
            "hook_resid_pre",
            *BRANCHES[attention_type][:-1],
            "hook_resid_mid",
            "hook_mlp_out",
            "hook_resid_post",
        ]  # fmt: skip (as they fired)
        added = [cache[f"{block}.{name}"] for name in BRANCHES[attention_type]]
        assert all(a.shape == (2, 1 + FRAMES * PATCHES, 32) for a in added)
        pre, post = cache[f"{block}.hook_resid_pre"], cache[f"{block}.hook_resid_post"]
        torch.testing.assert_close(pre + sum(added), post, rtol=0, atol=1e-5)
        torch.testing.assert_close(
            pre + sum(added[:-1]), cache[f"{block}.hook_resid_mid"], rtol=0, atol=1e-5
        )
        assert all(float(a.abs().max()) > 0.05 for a in added)  # each far above the tolerance
        if attention_type == "divided_space_time":
            assert not added[0][:, 0].any()  # the class token takes no part in the temporal step
        with torch.no_grad():
            own = model(x, output_hidden_states=True).hidden_states
        torch.testing.assert_close(post, frame_major(own[i + 1]))


def _zero(index: tuple) -> callable:
    """A vizkit forward function zeroing ``value[index]`` (a copy)."""

    def edit(value: torch.Tensor, *, name: str) -> torch.Tensor:
        value = value.clone()
        value[index] = 0
        return value

    return edit


_ALL = (slice(None),)
# (attention type, branch, the branch's index on the clip's tokens [B, 1 + T·Np', C],
#  the transformers module, the same tensor's index in that module's output)
EDITS = [
    ("divided_space_time", "hook_temporal_out", _ALL, "temporal_dense", _ALL),
    ("divided_space_time", "hook_temporal_out", (slice(None), 1 + 2 * PATCHES + 5),
     "temporal_dense", (slice(None), 5 * FRAMES + 2)),  # frame 2, patch 5 (space-major p·T + t)
    ("divided_space_time", "hook_spatial_out", _ALL, "attention", _ALL),
    ("divided_space_time", "hook_spatial_out", (slice(None), 1 + 2 * PATCHES + 5),
     "attention", (slice(2, None, FRAMES), 1 + 5)),  # frame 2's rows (b·T + 2), patch 5
    ("divided_space_time", "hook_spatial_out", (slice(None), 0),
     "attention", (slice(None), 0)),  # the class token's mean: every frame's class output
    ("divided_space_time", "hook_mlp_out", _ALL, "output", _ALL),
    ("joint_space_time", "hook_attn_out", _ALL, "attention", _ALL),
    ("joint_space_time", "hook_attn_out", (slice(None), 1 + 2 * PATCHES + 5),
     "attention", (slice(None), 1 + 5 * FRAMES + 2)),
    ("joint_space_time", "hook_mlp_out", _ALL, "output", _ALL),
]  # fmt: skip


@pytest.mark.parametrize(("attention_type", "branch", "index", "module", "raw"), EDITS)
def test_an_edit_of_a_branch_by_name_equals_the_same_edit_on_the_models_tensor(
    attention_type, branch, index, module, raw
):
    """Zeroing (part of) a branch through its name changes the output (the logits and the last
    block's tokens) exactly as zeroing the same numbers of the transformers module's output with
    a plain torch hook (the attention modules return a tuple: its first item); no hook is left
    after."""
    model, x = loud(attention_type), clips()
    hm = vk.HookedModel(model)
    before = _hooks(model)
    clean = _outputs(model, x)
    for layer in (0, 1):
        name = f"timesformer.encoder.layer.{layer}.{branch}"
        with hm.hooks(fwd={name: _zero(index)}):
            edited = _outputs(model, x)

        def zero_raw(mod, args, out):
            tensor = (out[0] if isinstance(out, tuple) else out).clone()
            tensor[raw] = 0
            return (tensor, *out[1:]) if isinstance(out, tuple) else tensor

        target = model.timesformer.encoder.layer[layer].get_submodule(module)
        handle = target.register_forward_hook(zero_raw)
        try:
            expected = _outputs(model, x)
        finally:
            handle.remove()
        torch.testing.assert_close(edited, expected, rtol=0, atol=1e-5)
        assert float((edited - clean).abs().max()) > 1e-3  # 100x the tolerance
    assert _hooks(model) == before


def _outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, K + N·C) the logits and the last block's tokens, side by side."""
    with torch.no_grad():
        out = model(x, output_hidden_states=True)
    return torch.cat([out.logits, out.hidden_states[-1].flatten(1)], 1)


def test_the_temporal_steps_class_token_row_cannot_be_edited():
    model, x = build(), clips()
    hm = vk.HookedModel(model)

    def write_class(value, *, name):
        value = value.clone()
        value[:, 0] = 1.0
        return value

    name = "timesformer.encoder.layer.0.hook_temporal_out"
    with pytest.raises(ValueError, match="adds nothing to the class token.*hook_spatial_out"):
        with torch.no_grad(), hm.hooks(fwd={name: write_class}):
            model(x)
    assert not any(n for n, _ in _hooks(model))


@pytest.mark.parametrize("attention_type", list(BRANCHES))
def test_a_branchs_gradient_is_the_gradient_of_the_stream_it_is_added_to(attention_type):
    """d score / d branch == d score / d (the stream it is added into): the attention's at
    hook_resid_mid, the MLP's at hook_resid_post, every token, the class token included (its
    spatial output is a mean over the frames, which a plain layout change would get wrong by a
    factor of T)."""
    model, x = build(attention_type), clips()
    attention = BRANCHES[attention_type][-2]
    block = "timesformer.encoder.layer.0"
    names = [f"{block}.{n}" for n in (attention, "hook_resid_mid", "hook_mlp_out",
                                      "hook_resid_post")]  # fmt: skip
    _, cache = vk.HookedModel(model).run_with_cache(x, names=names, grads=True, target=1)
    grad = {n.removeprefix(f"{block}."): cache[f"{n}_grad"] for n in names}
    assert float(grad["hook_resid_mid"][:, 0].abs().max()) > 1e-3
    torch.testing.assert_close(grad[attention], grad["hook_resid_mid"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad["hook_mlp_out"], grad["hook_resid_post"], rtol=1e-5, atol=1e-7)


def test_space_major_conversions_invert_each_other():
    tokens = torch.randn(2, 1 + PATCHES * FRAMES, 8)
    back = space_major_stream(space_major_stream(tokens, FRAMES, 1), FRAMES, 1, inverse=True)
    assert torch.equal(back, tokens)
    torch.testing.assert_close(space_major_stream(tokens, FRAMES, 1), frame_major(tokens))
    maps = torch.rand(2, 3, 1 + PATCHES * FRAMES, 1 + PATCHES * FRAMES)
    there = space_major_map(maps, FRAMES, 1)
    assert torch.equal(space_major_map(there, FRAMES, 1, inverse=True), maps)


@pytest.mark.parametrize("layer", [0, 1])
def test_divided_maps_on_the_clips_tokens_reproduce_each_steps_own_output(layer):
    """The captured maps are the softmax of each step's own q k^T; on the clip's tokens
    (frame-major) the temporal and spatial maps times the value vectors give the modules' own
    outputs, the class token's spatial output averaged over the frames as the block does."""
    model, x = build(), clips()
    result = vk.attention(model, x)
    assert result.patterns.shape == (4, 2, HEADS, 1 + PATCHES * FRAMES, 1 + PATCHES * FRAMES)
    torch.testing.assert_close(result.patterns.sum(-1), torch.ones(4, 2, HEADS, 65))
    temporal, spatial = result.patterns[2 * layer], result.patterns[2 * layer + 1]

    inner, inputs, context = _attention_io(model, x, layer, "temporal_attention")
    values = _values(inner, inputs)  # (B·Np', H, T, d), batch b·Np' + p
    on_tokens = values.unflatten(0, (2, PATCHES)).permute(0, 2, 3, 1, 4).flatten(2, 3)
    out = temporal[:, :, 1:, 1:] @ on_tokens  # (B, H, T·Np', d), frame-major
    own = context.unflatten(0, (2, PATCHES)).transpose(1, 2).flatten(1, 2)  # (B, T·Np', C)
    torch.testing.assert_close(out.transpose(1, 2).flatten(2), own, rtol=1e-5, atol=1e-6)
    assert torch.equal(temporal[:, :, 0], torch.eye(65)[0].expand(2, HEADS, 65))

    inner, inputs, context = _attention_io(model, x, layer, "attention")
    values = _values(inner, inputs).unflatten(0, (2, FRAMES))  # (B, T, H, 1 + Np', d)
    tokens = torch.cat([values[:, 0, :, :1], values[:, :, :, 1:].transpose(1, 2).flatten(2, 3)], 2)
    out = (spatial @ tokens).transpose(1, 2).flatten(2)  # (B, 65, C)
    frames = context.unflatten(0, (2, FRAMES))  # (B, T, 1 + Np', C)
    own = torch.cat([frames[:, :, :1].mean(1), frames[:, :, 1:].flatten(1, 2)], 1)
    torch.testing.assert_close(out, own, rtol=1e-5, atol=1e-6)
    # the spatial step's maps as the model returns them (output_attentions)
    with torch.no_grad():
        returned = model(x, output_attentions=True).attentions[layer]
    _, cache = vk.HookedModel(model).run_with_cache(x, names="*.attention.hook_pattern")
    torch.testing.assert_close(
        cache[f"timesformer.encoder.layer.{layer}.attention.hook_pattern"], returned
    )


def test_rollout_multiplies_both_steps_of_every_block_by_hand():
    model, x = build(), clips()
    patterns = vk.attention(model, x).patterns.double()  # temporal 0, spatial 0, temporal 1, ...
    joint = None
    for layer in patterns:
        step = layer.mean(1) + torch.eye(65, dtype=torch.float64)
        step = step / step.sum(-1, keepdim=True)
        joint = step if joint is None else step @ joint
    expected = joint[:, 0, 1:].float().unflatten(-1, (FRAMES, *GRID))
    result = vk.rollout(model, x)
    assert result.maps.shape == (2, FRAMES, *GRID) and result.frames == FRAMES
    torch.testing.assert_close(result.maps, expected, rtol=1e-4, atol=1e-6)


def test_joint_space_time_maps_equal_the_models_own_held_frame_major():
    model, x = build("joint_space_time"), clips()
    with torch.no_grad():
        own = torch.stack(model(x, output_attentions=True).attentions)  # space-major
    result = vk.attention(model, x)
    expected = torch.stack([space_major_map(a, FRAMES, 1) for a in own])
    torch.testing.assert_close(result.patterns, expected, rtol=1e-5, atol=1e-6)
    assert vk.rollout(model, x).maps.shape == (2, FRAMES, *GRID)


def test_space_only_attention_is_not_covered():
    with pytest.raises(ValueError, match="takes images as far as vizkit knows.*TimeSformer with"):
        vk.attention(build("space_only"), clips())


def test_every_video_analysis_runs_over_space_time_and_cp_lrp_conserves():
    """Token maps (B, T, gh, gw), pixel maps (B, T, H, W); with the constants that absorb
    relevance zeroed (class token, position and time tables, biases), CP-LRP's relevance sums
    to the target logit; AttnLRP's softmax rule keeps part of it (the paper's Prop. 3.1)."""
    model, x = build(), clips()
    for method in ("gradcam", "layercam", "legrad", "grad_rollout", "transformer_attribution"):
        result = getattr(vk, method)(model, x, target=1)
        assert result.maps.shape == (2, FRAMES, *GRID) and result.targets.tolist() == [1, 1]
        assert bool(torch.isfinite(result.maps).all())
    assert vk.eigencam(model, x).maps.shape == (2, FRAMES, *GRID)
    for method in ("saliency", "integrated_gradients", "attnlrp"):
        assert getattr(vk, method)(model, x, target=1).maps.shape == (2, FRAMES, 32, 32)
    with torch.no_grad():
        embeddings = model.timesformer.embeddings
        for table in (embeddings.cls_token, embeddings.position_embeddings,
                      embeddings.time_embeddings):  # fmt: skip
            table.zero_()
        for module in model.modules():
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        logits = model(x).logits[:, 1]
    cp = vk.attnlrp(model, x, target=1, attention="cp").maps.sum((1, 2, 3))
    torch.testing.assert_close(cp, logits, rtol=1e-3, atol=1e-5)
