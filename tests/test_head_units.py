"""A block's attention heads as concept units (`vk.concepts.Heads`): each head's map is the norm
of what it writes to the stream at each patch, against hand computations with plain torch on a
timm ViT (its projection's input sliced per head) and on torchvision's fused
MultiheadAttention (the attention recomputed from its in_proj weights); names checked on
held-out images; refusals; the model left as it was."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F
from representatives import drawn

import vizkit as vk
from vizkit.concepts import Concepts, Heads, check_names, dissect, shapes_concepts
from vizkit.concepts.units import read_units
from vizkit.models import representatives

SIZE, PATCH, HEADS = 32, 8, 4


def _timm_vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=SIZE, patch_size=PATCH, depth=2,
                             embed_dim=32, num_heads=HEADS, num_classes=3).eval()  # fmt: skip


def _untouched(model: torch.nn.Module) -> tuple:
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    grads = sum(p.grad is not None for p in model.parameters())
    return hooks, grads, model.training


def _read(model: torch.nn.Module, block: str, x: torch.Tensor) -> torch.Tensor:
    units = read_units(vk.HookedModel(model), Heads(block), tuple(x.shape[-2:]), x[:1])
    return units.read(x, range(len(x)))


def test_a_timm_heads_map_is_the_norm_of_its_write_at_each_patch():
    model = _timm_vit()
    x = torch.randn(3, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    before = _untouched(model)
    maps = _read(model, "blocks.1", x)  # (B, H, gh, gw)
    assert maps.shape == (3, HEADS, SIZE // PATCH, SIZE // PATCH)
    assert _untouched(model) == before
    seen = []
    proj = model.blocks[1].attn.proj
    handle = proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        model(x)
    handle.remove()
    z = seen[0][:, 1:]  # (B, Np, H d): the patches, after the class token
    d = z.shape[-1] // HEADS
    for h in range(HEADS):
        write = z[..., h * d : (h + 1) * d] @ proj.weight[:, h * d : (h + 1) * d].T
        expected = write.norm(dim=-1).view(3, SIZE // PATCH, SIZE // PATCH)
        torch.testing.assert_close(maps[:, h], expected, rtol=1e-4, atol=1e-5)


def test_a_fused_multihead_attentions_heads_against_its_in_proj_weights():
    """torchvision's ViT: the kernel applies out_proj itself; the heads' writes are recomputed
    from the block's normed input, in_proj and out_proj (Vaswani et al. 2017, Sec. 3.2.2)."""
    model = drawn(representatives.LIBRARIES["torchvision"]["VisionTransformer (vit_b_16)"].build)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    block = "encoder.layers.encoder_layer_1"
    maps = _read(model, block, x)
    layer = model.encoder.layers.encoder_layer_1
    attention, seen = layer.self_attention, []
    handle = layer.ln_1.register_forward_hook(lambda m, args, out: seen.append(out))
    with torch.no_grad():
        model(x)
    handle.remove()
    q, k, v = F.linear(seen[0], attention.in_proj_weight, attention.in_proj_bias).chunk(3, -1)
    heads = attention.num_heads
    split = lambda t: t.unflatten(-1, (heads, -1)).transpose(1, 2)  # noqa: E731  (B, H, N, d)
    q, k, v = split(q), split(k), split(v)
    weights = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).softmax(-1)
    z = weights @ v  # (B, H, N, d)
    out = attention.out_proj.weight.view(-1, heads, z.shape[-1])  # (C, H, d)
    writes = torch.einsum("bhnd,chd->bhnc", z, out).norm(dim=-1)[:, :, 1:]  # (B, H, Np)
    torch.testing.assert_close(maps.flatten(2), writes, rtol=1e-4, atol=1e-5)
    assert maps.shape[1] == heads == 2


def test_heads_named_by_dissection_and_checked_on_held_out_images():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images, concepts = shapes_concepts(40)
    named = dissect(model, images, concepts, Heads("blocks.3"), batch_size=16, progress=False)
    assert named.units == [f"blocks.3 head {h}" for h in range(4)]
    assert named.options["units"] == "heads"
    assert named.options["layer"] == "blocks.3.hook_attn_out"
    assert named.iou.shape == (4, len(concepts.names)) and (named.iou <= 1).all()
    held, held_concepts = shapes_concepts(40, seed=1)
    checked = check_names(model, named, held, held_concepts, progress=False)
    assert checked.units == named.units and checked.names == named.labels
    finite = checked.held_out_auc[~checked.held_out_auc.isnan()]
    assert ((finite >= 0) & (finite <= 1)).all() and len(finite) >= 1


def test_heads_are_refused_from_a_store_and_for_an_unknown_block(tmp_path):
    model = _timm_vit()
    x = torch.randn(4, 3, SIZE, SIZE)
    concepts = Concepts(["a"], torch.zeros(4, 1, SIZE, SIZE, dtype=torch.bool))
    with pytest.raises(ValueError, match="not a block of this model"):
        dissect(model, x, concepts, Heads("blocks.7"), progress=False)
    store = vk.cache_activations(model, x, tmp_path / "s", layers=["blocks.1.hook_resid_post"],
                                 progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="not each head's output"):
        dissect(model, None, concepts, Heads("blocks.1"), store=store, progress=False)
    with pytest.raises(TypeError, match="block's name"):
        Heads(1)
    assert _untouched(model) == (0, 0, False)
