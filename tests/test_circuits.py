"""Attribution patching (vizkit.circuits) against a hand-written first-order computation on a
timm ViT, against exact patching, and the contract: the model as it was, clear refusals."""

from __future__ import annotations

import pytest
import torch
from conftest import model_state, torchvision_vit

import vizkit as vk
from vizkit.circuits import ComponentGraph, agreement, attribution_patching, exact_patching


def _vit(depth: int = 3):
    torch.manual_seed(0)
    model = vk.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=depth, num_classes=5,
        embed_dim=48, num_heads=3, init_values=0.7,
    ).eval()  # fmt: skip
    generator = torch.Generator().manual_seed(1)
    clean = torch.randn(3, 3, 32, 32, generator=generator)
    corrupted = torch.randn(3, 3, 32, 32, generator=generator)
    return model, clean, corrupted


def _heads_side_by_side(attn, h):
    """timm's attention written out: (B, N, C) -> the heads' outputs side by side (B, N, C)."""
    b, n, _ = h.shape
    q, k, v = attn.qkv(h).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(q), attn.k_norm(k)
    weights = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)
    return attn.norm((weights @ v).transpose(1, 2).reshape(b, n, -1))


def _by_hand(model, embedded, inputs):
    """The model from its embedded tokens, each downstream input read as the stream plus a
    tensor of its own (``inputs``: D of (B, N, C)): logits, per block the heads' outputs z and
    the MLP's output."""
    stream, zs, mlps = embedded, [], []
    for layer, block in enumerate(model.blocks):
        z = _heads_side_by_side(block.attn, block.norm1(stream + inputs[2 * layer]))
        zs.append(z)
        stream = stream + block.ls1(block.attn.proj(z))
        mlps.append(block.ls2(block.mlp(block.norm2(stream + inputs[2 * layer + 1]))))
        stream = stream + mlps[-1]
    return model.forward_head(model.norm(stream + inputs[-1])), zs, mlps


def _embedded(model, x):
    seen = {}
    handle = model.blocks[0].register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
    with torch.no_grad():
        model(x)
    handle.remove()
    return seen["x"]


def _written_out(model, clean, corrupted):
    """By hand: the embedded clean tokens, the gradients (D, B, N, C) of the clean target
    logit at each downstream input, the heads' outputs' gradients, and each node's difference
    (corrupted less clean) in the stream in graph order, a head's W_O^h z_h written out from
    the projection's weight slice."""
    e_clean, e_corrupted = _embedded(model, clean), _embedded(model, corrupted)
    inputs = [
        torch.zeros_like(e_clean, requires_grad=True) for _ in range(2 * len(model.blocks) + 1)
    ]
    logits, z_clean, mlp_clean = _by_hand(model, e_clean, inputs)
    for z in z_clean:
        z.retain_grad()
    logits.gather(1, logits.argmax(1, keepdim=True)).sum().backward()
    with torch.no_grad():
        zeros = [torch.zeros_like(e_clean)] * len(inputs)
        _, z_corrupted, mlp_corrupted = _by_hand(model, e_corrupted, zeros)
        deltas, head_terms = [e_corrupted - e_clean], []
        for layer, block in enumerate(model.blocks):
            dz, heads = z_corrupted[layer] - z_clean[layer], block.attn.num_heads
            for h in range(heads):
                part = slice(h * block.attn.head_dim, (h + 1) * block.attn.head_dim)
                deltas.append(dz[..., part] @ block.attn.proj.weight[:, part].T * block.ls1.gamma)
                head_terms.append((dz[..., part] * z_clean[layer].grad[..., part]).sum((1, 2)))
            deltas.append(mlp_corrupted[layer] - mlp_clean[layer])
    return e_clean, torch.stack([i.grad for i in inputs]), torch.stack(head_terms, 1), deltas


def test_edges_and_nodes_equal_the_first_order_terms_written_out():
    """Syed et al. 2023, Eq. 2: edge (u, d) = (a_u(corrupted) - a_u(clean)) . dM/d(input of d);
    a head's node: its z difference times the gradient at z."""
    model, clean, corrupted = _vit()
    result = attribution_patching(model, clean, corrupted, progress=False)
    _, gradients, head_terms, deltas = _written_out(model, clean, corrupted)
    feeds = ComponentGraph(("a", "b", "c"), (3,) * 3).edges()
    expected = torch.full_like(result.edges, torch.nan)
    for u, delta in enumerate(deltas):
        first = int(feeds[u].nonzero()[0])
        expected[:, u, first:] = torch.einsum("bnc,dbnc->bd", delta, gradients[first:])
    torch.testing.assert_close(result.edges, expected, rtol=1e-4, atol=1e-6, equal_nan=True)
    is_head = torch.tensor(["head" in name for name in result.upstream])
    torch.testing.assert_close(result.nodes[:, is_head], head_terms, rtol=1e-4, atol=1e-6)
    # a node's effect is its edges' sum; the graph's edges are where u writes before d reads
    torch.testing.assert_close(result.nodes, result.edges.nansum(-1), rtol=1e-4, atol=1e-6)
    assert torch.equal(~result.edges[0].isnan(), feeds)


def test_exact_edges_equal_the_model_run_by_hand_with_one_input_changed():
    """Exact patching of edge (u, d) is the model with input d alone reading u's difference
    more: the hand-written model with that input's own term set to it."""
    model, clean, corrupted = _vit(depth=2)
    exact = exact_patching(model, clean, corrupted, progress=False)
    e_clean, _, _, deltas = _written_out(model, clean, corrupted)
    targets = exact.targets[:, None]
    zeros = [torch.zeros_like(e_clean)] * exact.edges.shape[-1]
    with torch.no_grad():
        base = _by_hand(model, e_clean, zeros)[0].gather(1, targets)[:, 0]
        torch.testing.assert_close(base, exact.clean_score, rtol=1e-5, atol=1e-6)
        for u, d in exact.edges[0].isnan().logical_not().nonzero().tolist():
            inputs = [deltas[u] if i == d else z for i, z in enumerate(zeros)]
            by_hand = _by_hand(model, e_clean, inputs)[0].gather(1, targets)[:, 0] - base
            torch.testing.assert_close(exact.edges[:, u, d], by_hand, rtol=1e-4, atol=1e-5)
    patched = vk.activation_patching(model, corrupted, clean, target=exact.targets,
                                     sites=("heads", "mlp"), progress=False)  # fmt: skip
    heads = patched.scores["heads"].flatten(1) - exact.clean_score[:, None]
    is_head = torch.tensor(["head" in name for name in exact.upstream])
    torch.testing.assert_close(exact.nodes[:, is_head], heads, rtol=1e-4, atol=1e-5)
    mlps = [exact.upstream.index(f"blocks.{b} mlp") for b in range(2)]
    mlp = patched.scores["mlp"] - exact.clean_score[:, None]
    torch.testing.assert_close(exact.nodes[:, mlps], mlp, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(exact.node("embed"), exact.corrupted_score - exact.clean_score,
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    # EAP-IG is the more faithful (Hanna et al. 2024): r 0.72 (EAP) and 0.997 (5 steps) here
    eap = agreement(attribution_patching(model, clean, corrupted, progress=False), exact)
    ig = attribution_patching(model, clean, corrupted, method="eap-ig", progress=False)
    edges, nodes = agreement(ig, exact, "edges", k=5), agreement(ig, exact, "nodes", k=3)
    assert edges.count == int(ComponentGraph(("a", "b"), (3, 3)).edges().sum())
    assert edges.correlation > 0.95 and nodes.correlation > 0.95 and nodes.top_k >= 2 / 3
    assert 0.3 < eap.correlation < edges.correlation - 0.1


def test_attribution_agrees_with_exact_patching_and_eap_ig_is_complete():
    """The first-order effects track exact patching (vk.activation_patching of the corrupted
    activations into the clean run); EAP-IG's embedding node integrates the gradient along the
    whole path, so it tends to the exact effect of patching every token (completeness)."""
    model, clean, corrupted = _vit()
    eap = attribution_patching(model, clean, corrupted, progress=False)
    exact = vk.activation_patching(model, corrupted, clean, target=eap.targets,
                                   sites=("heads", "mlp"), progress=False)  # fmt: skip
    changed = {site: (exact.scores[site] - exact.corrupted_score[:, None, None]
                      if site == "heads" else exact.scores[site] - exact.corrupted_score[:, None])
               for site in ("heads", "mlp")}  # fmt: skip
    heads = torch.stack([eap.node(f"blocks.{b} head {h}") for b in range(3) for h in range(3)], 1)
    mlps = torch.stack([eap.node(f"blocks.{b} mlp") for b in range(3)], 1)
    for approx, real in ((heads, changed["heads"].flatten(1)), (mlps, changed["mlp"])):
        assert torch.corrcoef(torch.stack([approx.flatten(), real.flatten()]))[0, 1] > 0.9
    ig = attribution_patching(model, clean, corrupted, method="eap-ig", steps=32, progress=False)
    whole = eap.corrupted_score - eap.clean_score
    assert (ig.node("embed") - whole).abs().max() < 0.05 * whole.abs().max()
    one_step = attribution_patching(model, clean, corrupted, method="eap-ig", steps=1,
                                    progress=False)  # fmt: skip
    torch.testing.assert_close(one_step.edges, eap.edges, equal_nan=True)


def test_heads_as_one_node_sum_the_heads_and_the_model_is_left_as_it_was():
    model, clean, corrupted = _vit(depth=2)
    before = model_state(model)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    by_head = attribution_patching(model, clean, corrupted, target=1, versus=2, progress=False)
    whole = attribution_patching(model, clean, corrupted, target=1, versus=2, heads=False,
                                 progress=False)  # fmt: skip
    assert model_state(model) == before
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    assert whole.upstream == ["embed", "blocks.0 attn", "blocks.0 mlp", "blocks.1 attn",
                              "blocks.1 mlp"]  # fmt: skip
    for layer in range(2):
        rows = [by_head.upstream.index(f"blocks.{layer} head {h}") for h in range(3)]
        attn = whole.upstream.index(f"blocks.{layer} attn")
        torch.testing.assert_close(by_head.edges[:, rows].sum(1), whole.edges[:, attn],
                                   rtol=1e-4, atol=1e-6, equal_nan=True)  # fmt: skip
    assert torch.equal(by_head.targets, torch.ones(3, dtype=torch.long))
    torch.testing.assert_close(by_head.resid[:, 0].sum(1), by_head.node("embed"))


def test_a_backbone_score_and_refusals():
    model, clean, corrupted = _vit(depth=2)
    norm = attribution_patching(model, clean, corrupted, target=vk.targets.embedding_norm(),
                                progress=False)  # fmt: skip
    assert norm.targets is None and torch.isfinite(norm.nodes).all()
    with pytest.raises(ValueError, match="same shape"):
        attribution_patching(model, clean, corrupted[:2], progress=False)
    with pytest.raises(ValueError, match="method"):
        attribution_patching(model, clean, corrupted, method="acdc", progress=False)
    fused = torchvision_vit()
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match="Use heads=False") as refused:
        attribution_patching(fused, x, x.flip(0), progress=False)
    assert "heads=False" in str(refused.value)
    by_block = attribution_patching(fused, x, x.flip(0), heads=False, progress=False)
    assert by_block.upstream[1].endswith(" attn") and torch.isfinite(by_block.nodes).all()
