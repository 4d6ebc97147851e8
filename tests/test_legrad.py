"""LeGrad against torch-cam's implementation on torchvision's ViT (its score projection set to
the readout the model uses: the encoder's norm, the class token, the heads), on every layer; and
on timm's ViT family through the family's head readout."""

from __future__ import annotations

import pytest
import torch
from conftest import build, torchvision_vit

import vizkit as vk

torchvision = pytest.importorskip("torchvision")
timm = pytest.importorskip("timm")
torchcam = pytest.importorskip("torchcam.methods")


def test_legrad_equals_torch_cam_on_torchvision_vit():
    model = torchvision_vit(layers=3)
    x, targets = torch.randn(3, 3, 32, 32), [2, 0, 4]
    ours = vk.legrad(model, x, target=targets)

    def readout(tokens):
        return model.heads(model.encoder.ln(tokens)[:, 0])

    with torchcam.LeGrad(model, list(model.encoder.layers), score_projection=readout) as cam:
        theirs = cam(targets, model(x), normalized=False)[0]
    torch.testing.assert_close(ours.maps, theirs, rtol=1e-5, atol=1e-6 * theirs.abs().max())
    assert ours.options["layers"][0] == "encoder.layers.encoder_layer_0.self_attention.hook_pattern"
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("key", ["vit", "deit_distilled", "vit_reg_avg"])
def test_legrad_on_timm_vits_reads_their_head_per_layer(key):
    model, x = build(key)
    result = vk.legrad(model, x[:2], target=1)
    assert result.maps.shape == (2, *result.layout.grid) and (result.maps >= 0).all()
    last = vk.legrad(model, x[:2], target=1, layers=-1)  # one layer: its own map alone
    assert last.options["layers"] == result.options["layers"][-1:]
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())


def test_legrad_refuses_cait_and_maps_without_a_gradient():
    model, x = build("cait")  # CaiT's head reads the class-attention stage, not a block
    with pytest.raises(ValueError, match="none in CaiT"):
        vk.legrad(model, x)
    torch.manual_seed(0)
    levit = timm.create_model("levit_128s", img_size=64, num_classes=5).eval()
    with pytest.raises(ValueError, match="has no gradient"):  # maps computed beside the kernel
        vk.legrad(levit, torch.randn(1, 3, 64, 64))


def _hand_legrad(patterns, grads_of, layout):
    """The paper's per-layer relevance (positive gradient at A^l, mean over heads and
    queries), averaged over layers, the patches on the grid."""
    keys = torch.stack([grads_of(p).clamp_min(0).mean((1, 2)) for p in patterns]).mean(0)
    return layout.to_grid(layout.split(keys, dim=-1)[1])


def test_legrad_under_a_wrapper_reads_the_wrappers_own_head():
    """Where the model's output is not its family's head (a wrapper adds a head), each layer's
    score is the model's whole forward with the last block's output replaced: here the
    wrapper's linear layer on the ViT's head, as written out by hand."""
    vit = timm.create_model("test_vit", num_classes=10).eval()
    torch.manual_seed(0)
    extra = torch.nn.Linear(10, 3)
    wrapped = torch.nn.Sequential(vit, extra).eval()
    x = torch.randn(2, 3, 64, 64)
    ours = vk.legrad(wrapped, x, target=2)
    hm = vk.HookedModel(vit)
    names = [n for n in hm.hook_names() if n.endswith("attn.hook_pattern")]
    posts = [n.replace("attn.hook_pattern", "hook_resid_post") for n in names]
    captured = {}
    with torch.enable_grad(), hm.hooks(fwd={n: lambda v, *, name: captured.update({name: v})
                                            for n in names + posts}):  # fmt: skip
        hm(x.clone().requires_grad_(True))

    def grads_of(pattern):
        post = posts[[captured[n] is pattern for n in names].index(True)]
        score = extra(vit.forward_head(vit.norm(captured[post])))[:, 2].sum()
        return torch.autograd.grad(score, pattern, retain_graph=True)[0]

    layout = hm.token_layout((64, 64))
    expected = _hand_legrad([captured[n] for n in names], grads_of, layout)
    torch.testing.assert_close(ours.maps, expected, rtol=1e-5, atol=1e-8)
    same_head = torch.nn.Sequential(torch.nn.Identity(), vit).eval()  # e.g. a normalization
    torch.testing.assert_close(vk.legrad(same_head, x, target=2).maps,
                               vk.legrad(vit, x, target=2).maps)  # fmt: skip


def test_legrad_on_swin_windows_equals_the_window_partition_by_hand():
    """Swin's last stage, shifted windows: each key's relevance is the mean over its window's
    queries, put back at the token timm's own window_partition took it from (after the
    shift's roll), the head the model's own (norm, average pooling, classifier)."""
    from timm.models.swin_transformer import window_partition

    torch.manual_seed(0)
    model = timm.create_model(
        "swin_tiny_patch4_window7_224", img_size=64, window_size=2, embed_dim=16,
        depths=(1, 1, 2), num_heads=(1, 1, 2), num_classes=5,
    ).eval()  # fmt: skip
    x = torch.randn(2, 3, 64, 64)
    ours = vk.legrad(model, x, target=3)
    assert ours.maps.shape == (2, 4, 4)
    blocks = list(model.layers[-1].blocks)
    maps, outputs = {}, {}
    hooks = [b.attn.softmax.register_forward_hook(
        lambda m, i, o, k=k: maps.__setitem__(k, o)) for k, b in enumerate(blocks)]  # fmt: skip
    hooks += [b.register_forward_hook(
        lambda m, i, o, k=k: outputs.__setitem__(k, o)) for k, b in enumerate(blocks)]  # fmt: skip
    try:
        with torch.enable_grad():
            model(x.clone().requires_grad_(True))
    finally:
        for hook in hooks:
            hook.remove()
    grid = torch.arange(16).view(1, 4, 4, 1)
    per_layer = []
    for k, block in enumerate(blocks):
        score = model.forward_head(model.norm(outputs[k]))[:, 3].sum()
        (grad,) = torch.autograd.grad(score, maps[k], retain_graph=True)
        keys = grad.clamp_min(0).mean((1, 2)).view(2, -1)  # (B, windows x window tokens)
        shift = block.shift_size
        index = torch.roll(grid, (-shift[0], -shift[1]), (1, 2)) if any(shift) else grid
        index = window_partition(index, block.window_size).reshape(-1)
        per_layer.append(torch.zeros(2, 16).index_copy(1, index, keys))
    expected = torch.stack(per_layer).mean(0).view(2, 4, 4)
    torch.testing.assert_close(ours.maps, expected, rtol=1e-5, atol=1e-8)
