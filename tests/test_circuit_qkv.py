"""Edges into each head's query, key and value input (attribution_patching(qkv=True)): against
a timm ViT written out by hand with an input of its own per head and per query, key and value,
their sum against the edge into the block's attention input (timm, transformers), and the
contract: the block-level result unchanged, the model as it was, clear refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_full_state, embedded_tokens, full_state
from torch import nn

import vizkit as vk
from vizkit.circuits import ComponentGraph, attribution_patching
from vizkit.models.representatives import LIBRARIES

TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}


def _vit(depth: int = 3, **options):
    torch.manual_seed(0)
    model = vk.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=depth, num_classes=5,
        embed_dim=48, num_heads=3, init_values=0.7, **options,
    ).eval()  # fmt: skip
    generator = torch.Generator().manual_seed(1)
    clean = torch.randn(3, 3, 32, 32, generator=generator)
    corrupted = torch.randn(3, 3, 32, 32, generator=generator)
    return model, clean, corrupted


def _transformers_vit():
    built = LIBRARIES["transformers"]["ViTForImageClassification"]
    torch.manual_seed(0)
    model = built.build().eval()
    clean, corrupted = torch.randn(2, 2, 3, built.size, built.size,
                                   generator=torch.Generator().manual_seed(1))  # fmt: skip
    return model, clean, corrupted


FAMILIES = {
    "timm": _vit,
    "timm with q_norm, k_norm": lambda: _vit(depth=2, qk_norm=True),
    "transformers": _transformers_vit,
}


def _attention_by_hand(attn, norm, stream, extra):
    """timm's attention written out, head h's query, key and value (p = 0, 1, 2) each computed
    from the stream plus its own ``extra[p][h]`` (B, N, C) through the norm: the heads'
    outputs side by side (B, N, C)."""
    b, n, width = stream.shape
    d = attn.head_dim

    def project(p, h):
        rows = slice(p * width + h * d, p * width + (h + 1) * d)
        return F.linear(norm(stream + extra[p][h]), attn.qkv.weight[rows], attn.qkv.bias[rows])

    q, k, v = (torch.stack([project(p, h) for h in range(attn.num_heads)], 1) for p in range(3))
    q, k = attn.q_norm(q), attn.k_norm(k)  # each (B, H, N, d)
    weights = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)
    return attn.norm((weights @ v).transpose(1, 2).reshape(b, n, -1))


def _by_hand(model, embedded, extra):
    """The model from its embedded tokens, block l's head h reading its query, key and value
    from the stream plus ``extra[l][p][h]``: logits, per block the heads' outputs z and the
    MLP's output."""
    stream, zs, mlps = embedded, [], []
    for layer, block in enumerate(model.blocks):
        zs.append(_attention_by_hand(block.attn, block.norm1, stream, extra[layer]))
        stream = stream + block.ls1(block.attn.proj(zs[-1]))
        mlps.append(block.ls2(block.mlp(block.norm2(stream))))
        stream = stream + mlps[-1]
    return model.forward_head(model.norm(stream)), zs, mlps


def _written_out(model, clean, corrupted):
    """By hand: the gradients (L, 3, H, B, N, C) of the clean top logit at each extra input,
    and each node's difference (corrupted less clean) in the stream in graph order, a head's
    W_O^h z_h written out from the projection's weight slice."""
    e_clean, e_corrupted = embedded_tokens(model, clean), embedded_tokens(model, corrupted)
    attn = model.blocks[0].attn
    layers, heads, d = len(model.blocks), attn.num_heads, attn.head_dim
    extra = [[[torch.zeros_like(e_clean, requires_grad=True) for _ in range(heads)]
              for _ in range(3)] for _ in range(layers)]  # fmt: skip
    logits, z_clean, mlp_clean = _by_hand(model, e_clean, extra)
    flat = [e for block in extra for path in block for e in path]
    top = logits.gather(1, logits.argmax(1, keepdim=True)).sum()
    gradients = torch.stack(torch.autograd.grad(top, flat)).unflatten(0, (layers, 3, heads))
    with torch.no_grad():
        zeros = [[[torch.zeros_like(e_clean)] * heads] * 3] * layers
        _, z_corrupted, mlp_corrupted = _by_hand(model, e_corrupted, zeros)
        deltas = [e_corrupted - e_clean]
        for layer, block in enumerate(model.blocks):
            dz = z_corrupted[layer] - z_clean[layer]
            for h in range(heads):
                part = slice(h * d, (h + 1) * d)
                deltas.append(dz[..., part] @ block.attn.proj.weight[:, part].T * block.ls1.gamma)
            deltas.append(mlp_corrupted[layer] - mlp_clean[layer])
    return gradients, deltas


@pytest.mark.parametrize("kind", ["timm", "timm with q_norm, k_norm"])
def test_qkv_edges_equal_the_first_order_terms_written_out(kind):
    """Syed et al. 2023, Eq. 2 with head h's query, key and value inputs as downstream nodes:
    edge (u, l, p, h) = (a_u(corrupted) - a_u(clean)) . dM/d(input of head h's path p)."""
    model, clean, corrupted = FAMILIES[kind]()
    result = attribution_patching(model, clean, corrupted, qkv=True, progress=False)
    gradients, deltas = _written_out(model, clean, corrupted)
    layers, heads = gradients.shape[:3:2]
    writes = ComponentGraph(tuple("abc"[:layers]), (heads,) * layers).writes_at()
    expected = torch.full_like(result.qkv, torch.nan)
    for u, delta in enumerate(deltas):
        for layer in range(layers):
            if writes[u] <= 2 * layer:
                expected[:, u, layer] = torch.einsum("bnc,phbnc->bph", delta, gradients[layer])
    assert result.qkv.shape == (3, len(result.upstream), layers, 3, heads)
    scale = expected.nan_to_num().abs().amax((0, 1))  # (L, 3, H): each path to its own scale
    assert scale.min() > 1e-6
    torch.testing.assert_close(result.qkv / scale, expected / scale, equal_nan=True, rtol=1e-4,
                               atol=2e-5)  # fmt: skip  # 3e-6 measured


def _summed_over_qkv_and_heads(result) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, U, L) the qkv edges summed over (3, H), and the edges into each attention input."""
    attention = [i for i, name in enumerate(result.downstream) if name.endswith(" attn in")]
    return result.qkv.sum((3, 4)), result.edges[:, :, attention]


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
@pytest.mark.parametrize("kind", list(FAMILIES))
def test_qkv_edges_sum_to_the_edge_into_the_attention_input(kind, method):
    """The gradient at a block's attention input is the sum of the gradients through each
    head's query, key and value, so each node's qkv edges sum to its edge into that input;
    with the attention as one node (heads=False) its qkv edges are its heads' summed."""
    model, clean, corrupted = FAMILIES[kind]()
    options = {"method": method, "steps": 2, "qkv": True, "progress": False}
    by_head, by_block = (
        attribution_patching(model, clean, corrupted, heads=heads, **options)
        for heads in (True, False)
    )
    for result in (by_head, by_block):
        summed, edges = _summed_over_qkv_and_heads(result)
        torch.testing.assert_close(summed, edges, equal_nan=True, **TOLERANCE)
        assert torch.equal(summed.isnan(), edges.isnan()) and summed.isfinite().any()
    for layer in range(len(by_block.downstream) // 2):
        rows = [i for i, name in enumerate(by_head.upstream)
                if name.startswith(f"{by_block.upstream[2 * layer + 1][:-5]} head ")]  # fmt: skip
        torch.testing.assert_close(by_head.qkv[:, rows].sum(1), by_block.qkv[:, 2 * layer + 1],
                                   equal_nan=True, **TOLERANCE)  # fmt: skip


def _fields(result) -> dict:
    return {k: v for k, v in vars(result).items() if k != "qkv"}


def _assert_equal_fields(result, other, exact: bool) -> None:
    for name, value in _fields(result).items():
        if isinstance(value, torch.Tensor):
            tolerance = {"rtol": 0, "atol": 0} if exact else TOLERANCE
            torch.testing.assert_close(value, getattr(other, name), equal_nan=True, **tolerance)
        else:
            assert value == getattr(other, name), name


def test_qkv_false_leaves_the_result_as_it_was():
    """qkv=False (the default) gives no qkv edges and exactly the result without it; qkv=True
    the same other fields (to rounding: the gradients come from one larger backward)."""
    model, clean, corrupted = _vit(depth=2)
    default = attribution_patching(model, clean, corrupted, method="eap-ig", steps=2,
                                   progress=False)  # fmt: skip
    without = attribution_patching(model, clean, corrupted, method="eap-ig", steps=2, qkv=False,
                                   progress=False)  # fmt: skip
    with_qkv = attribution_patching(model, clean, corrupted, method="eap-ig", steps=2, qkv=True,
                                    progress=False)  # fmt: skip
    assert default.qkv is None and without.qkv is None and with_qkv.qkv is not None
    _assert_equal_fields(without, default, exact=True)
    _assert_equal_fields(with_qkv, default, exact=False)
    assert with_qkv.options == default.options == {"method": "eap-ig", "steps": 2, "heads": True}


def _gated(model: nn.Module) -> nn.Module:
    """The model with block 1's attention output gated by its input (timm's gated Attention):
    the stream reaches the output beside the queries, keys and values."""
    torch.manual_seed(1)
    model.blocks[1].attn.gate = nn.Linear(48, 48)
    return model


def _beit() -> nn.Module:
    """A timm BEiT: its own attention class (relative position bias, q and v biases apart)."""
    torch.manual_seed(0)
    return vk.create_model(
        "beit_base_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=5,
        embed_dim=48, num_heads=3,
    ).eval()  # fmt: skip


def _multihead(library: str, name: str):
    built = LIBRARIES[library][name]
    torch.manual_seed(0)
    model = built.build().eval()
    clean, corrupted = torch.randn(2, 2, 3, built.size, built.size,
                                   generator=torch.Generator().manual_seed(1))  # fmt: skip
    target = vk.targets.embedding_norm() if library == "open_clip" else 1
    return model, clean, corrupted, target


REFUSED = {
    "torchvision": lambda: _multihead("torchvision", "VisionTransformer (vit_b_16)"),
    "open_clip": lambda: _multihead("open_clip", "CLIP visual tower (zero-shot)"),
    "beit": lambda: (_beit(), *_vit(depth=1)[1:], None),
    "gated": lambda: (_gated(_vit(depth=2)[0]), *_vit(depth=1)[1:], None),
}
WHY = {
    "torchvision": r"encoder_layer_0's attention is torch's nn.MultiheadAttention, which "
    r"computes its queries, keys and values inside its fused kernel",
    "open_clip": r"resblocks.0's attention is torch's nn.MultiheadAttention",
    "beit": r"blocks.0's attention \(timm.models.beit.Attention\) is neither timm's Attention "
    r"nor a transformers attention",
    "gated": r"blocks.1's gradient through its heads' queries, keys and values differs from the "
    r"gradient at its attention input .* reads the stream beside them",
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_an_attention_without_readable_queries_keys_and_values_is_refused(kind):
    """Refused saying why and that qkv=False works, which it does; the model left as it was,
    also after the refused call (the gated one refused after its gradient run)."""
    model, clean, corrupted, target = REFUSED[kind]()
    model.train()  # the analysis runs it in eval mode and gives it back as it came
    before = full_state(model)
    with pytest.raises(ValueError, match=f"{WHY[kind]}.*[Uu]se qkv=False"):
        attribution_patching(model, clean, corrupted, target=target, qkv=True, progress=False)
    assert_full_state(model, before)
    result = attribution_patching(model, clean, corrupted, target=target, progress=False)
    assert result.qkv is None and result.nodes.isfinite().all()
    assert_full_state(model, before)


def test_the_model_is_left_as_it_was():
    model, clean, corrupted = _vit(depth=2)
    model.train()
    before = full_state(model)
    result = attribution_patching(model, clean, corrupted, method="eap-ig", steps=2, qkv=True,
                                  progress=False)  # fmt: skip
    assert result.qkv.isfinite().any()
    assert_full_state(model, before)
