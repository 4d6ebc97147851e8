"""Attribution patching (vizkit.circuits) against a hand-written first-order computation on a
timm ViT, against exact patching, and the contract: the model as it was, clear refusals."""

from __future__ import annotations

import pytest
import torch
from conftest import build, embedded_tokens, model_state, torchvision_vit
from guide_example import run_first_example

import vizkit as vk
from vizkit.circuits import (
    ComponentGraph,
    acdc,
    agreement,
    attribution_patching,
    circuit,
    corrupt,
    corruption_effect,
    exact_patching,
    faithfulness,
)
from vizkit.circuits.planted import (
    planted_circuit_vit,
    planted_edges,
    planted_images,
    recovery_auc,
)


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


def _written_out(model, clean, corrupted):
    """By hand: the embedded clean tokens, the gradients (D, B, N, C) of the clean target
    logit at each downstream input, the heads' outputs' gradients, and each node's difference
    (corrupted less clean) in the stream in graph order, a head's W_O^h z_h written out from
    the projection's weight slice."""
    e_clean, e_corrupted = embedded_tokens(model, clean), embedded_tokens(model, corrupted)
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
    per_token = torch.zeros_like(result.tokens)
    for u, delta in enumerate(deltas):
        first = int(feeds[u].nonzero()[0])
        expected[:, u, first:] = torch.einsum("bnc,dbnc->bd", delta, gradients[first:])
        per_token[:, u] = torch.einsum("bnc,dbnc->bn", delta, gradients[first:])
    torch.testing.assert_close(result.edges, expected, rtol=1e-4, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(result.tokens, per_token, rtol=1e-4, atol=1e-6)
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
    fused.encoder.layers[0].self_attention.add_zero_attn = True  # a zero key: heads unreadable
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match="Use heads=False") as refused:
        attribution_patching(fused, x, x.flip(0), progress=False)
    assert "heads=False" in str(refused.value)
    cait, images = build("cait")
    with pytest.raises(ValueError, match="not one sum of the blocks' outputs"):
        attribution_patching(cait, images, images.flip(0), heads=False, progress=False)
    for exact_or_acdc in (exact_patching, acdc):
        with pytest.raises(ValueError, match="class-attention stage"):
            exact_or_acdc(cait, images, images.flip(0), heads=False, progress=False)
    by_block = attribution_patching(fused, x, x.flip(0), heads=False, progress=False)
    assert by_block.upstream[1].endswith(" attn") and torch.isfinite(by_block.nodes).all()


def test_a_circuit_runs_the_model_with_the_edges_outside_it_reading_the_reference():
    """Every edge kept: the model; none: the corrupted run; all but one: exact patching of that
    edge; two edges removed, written out by hand: block 0's attention reads the corrupted
    embedding, and the output reads block 0's MLP output of the corrupted run in place of the
    one this run made (which differs from the clean run's: its input changed)."""
    model, clean, corrupted = _vit(depth=2)
    scored = attribution_patching(model, clean, corrupted, heads=False, progress=False)
    exact = exact_patching(model, clean, corrupted, heads=False, progress=False)
    every = circuit(scored, 1.0)
    assert len(every) == 15 and len(circuit(scored, 3)) == 3 and circuit(scored, 0).nodes() == []
    torch.testing.assert_close(every.run(model, clean, corrupted), exact.clean_score)
    none = circuit(scored, 0)
    torch.testing.assert_close(none.run(model, clean, corrupted, target=exact.targets),
                               exact.corrupted_score, rtol=1e-4, atol=1e-5)  # fmt: skip
    u, d = scored.upstream.index("blocks.0 mlp"), scored.downstream.index("blocks.1 attn in")
    every.edges[u, d] = False
    torch.testing.assert_close(every.run(model, clean, corrupted) - exact.clean_score,
                               exact.edges[:, u, d], rtol=1e-4, atol=1e-5)  # fmt: skip
    every.edges[u, d] = True
    every.edges[0, 0] = every.edges[2, -1] = False  # embed -> blocks.0 attn in, its mlp -> output
    e_clean, e_ref = embedded_tokens(model, clean), embedded_tokens(model, corrupted)
    block0, block1 = model.blocks

    def block0_mlp(mid):
        return block0.ls2(block0.mlp(block0.norm2(mid)))

    with torch.no_grad():
        mid = e_clean + block0.ls1(block0.attn(block0.norm1(e_ref)))  # its attention reads e_ref
        reference_mid = e_ref + block0.ls1(block0.attn(block0.norm1(e_ref)))
        final = block1(mid + block0_mlp(mid)) + block0_mlp(reference_mid) - block0_mlp(mid)
        expected = model.forward_head(model.norm(final)).gather(1, exact.targets[:, None])[:, 0]
    torch.testing.assert_close(every.run(model, clean, corrupted), expected, rtol=1e-4, atol=1e-5)


def test_a_circuit_of_heads_reads_each_head_through_the_projection():
    """With a node per head: every edge kept is the model, none the corrupted run, all but one
    the exact patching of that edge (whose heads are split by zeroing their maps)."""
    model, clean, corrupted = _vit(depth=2)
    scored = attribution_patching(model, clean, corrupted, progress=False)
    exact = exact_patching(model, clean, corrupted, progress=False)
    every = circuit(scored, 1.0)
    torch.testing.assert_close(every.run(model, clean, corrupted), exact.clean_score)
    none = circuit(scored, 0).run(model, clean, corrupted, target=exact.targets)
    torch.testing.assert_close(none, exact.corrupted_score, rtol=1e-4, atol=1e-5)
    for u, d in (("blocks.0 head 1", "blocks.1 attn in"), ("blocks.1 head 2", "output")):
        u, d = scored.upstream.index(u), scored.downstream.index(d)
        every.edges[u, d] = False
        torch.testing.assert_close(every.run(model, clean, corrupted) - exact.clean_score,
                                   exact.edges[:, u, d], rtol=1e-4, atol=1e-5)  # fmt: skip
        every.edges[u, d] = True


def test_faithfulness_curve_and_refusals():
    model, clean, corrupted = _vit(depth=2)
    scored = attribution_patching(model, clean, corrupted, heads=False, method="eap-ig",
                                  progress=False)  # fmt: skip
    curve = faithfulness(model, scored, clean, corrupted, progress=False)
    assert curve.sizes.tolist() == [0, 1, 2, 4, 8, 15]
    assert curve.faithfulness[0] == 0 and abs(float(curve.faithfulness[-1]) - 1) < 1e-5
    torch.testing.assert_close(curve.scores[2], circuit(scored, 2).run(model, clean, corrupted))
    assert 0 < curve.cmd and curve.share[-1] == 1
    drawn = vk.viz.faithfulness_figure({"EAP-IG": curve}).data[0]
    assert list(drawn.y) == curve.faithfulness.tolist() and list(drawn.x)[-1] == 100
    assert drawn.name == f"EAP-IG (CPR {curve.cpr:.2f}, CMD {curve.cmd:.2f})"
    with pytest.raises(ValueError, match="15 edges"):
        circuit(scored, 16)
    with pytest.raises(ValueError, match="same mean score"):
        faithfulness(model, scored, clean, clean, progress=False)


def test_corruptions_and_their_effect():
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    assert torch.equal(corrupt(x), x[[1, 2, 0]])
    noisy = corrupt(x, "noise", noise=0.5, seed=3)
    assert torch.equal(noisy, corrupt(x, "noise", noise=0.5, seed=3))
    assert 0.4 < float((noisy - x).std() / x.std()) < 0.6
    masks = torch.zeros(3, 32, 32, dtype=torch.bool)
    masks[:, 8:16, 8:16] = True
    erased = corrupt(x, "erase", masks=masks)
    assert torch.equal(erased[:, :, ~masks[0]], x[:, :, ~masks[0]])
    torch.testing.assert_close(erased[:, :, 8, 8], x[:, :, ~masks[0]].mean(-1))
    with pytest.raises(ValueError, match="needs masks"):
        corrupt(x, "erase")
    with pytest.raises(ValueError, match="2\\+"):
        corrupt(x[:1])
    model, clean, corrupted = _vit(depth=2)
    effect = corruption_effect(model, clean, corrupted)
    assert not effect.unchanged.any() and "on average" in effect.summary()
    same = corruption_effect(model, clean, clean + 1e-6)
    assert same.unchanged.all() and "unchanged on 3 of 3" in same.summary()
    with pytest.warns(UserWarning, match="leave the score where it was"):
        attribution_patching(model, clean, clean + 1e-6, progress=False)


def test_counterfactual_shapes_differ_only_where_the_object_is():
    clean, removed, labels, masks = vk.datasets.counterfactual_shapes(6, seed=1)
    sample = vk.datasets.Shapes("test", n=6, seed=1)
    assert torch.equal(labels, sample.labels) and torch.equal(masks, sample.masks)
    assert torch.equal(clean[0], sample[0][0])
    differs = (clean != removed).any(1)
    assert bool((differs <= masks).all()) and bool(differs.any((1, 2)).all())
    _, swapped, _, _ = vk.datasets.counterfactual_shapes(6, seed=1, replace="next")
    objects = (labels.numpy() + 1) % 10
    _, next_labels, next_masks = vk.datasets.render_shapes(6, seed=1, split="test", objects=objects)
    assert torch.equal(torch.from_numpy(next_labels), (labels + 1) % 10)
    assert bool(((clean != swapped).any(1) <= (masks | torch.from_numpy(next_masks))).all())
    _, ringed, _, _ = vk.datasets.counterfactual_shapes(6, seed=1, replace=3)
    rings = vk.datasets.render_shapes(6, seed=1, split="test", objects=[3] * 6)[2]
    assert bool(((clean != ringed).any(1) <= (masks | torch.from_numpy(rings))).all())
    with pytest.raises(ValueError, match="a class in 0..9"):
        vk.datasets.counterfactual_shapes(6, replace=10)
    with pytest.raises(ValueError, match="objects must be 6 classes"):
        vk.datasets.render_shapes(6, seed=1, split="test", objects=[10] * 6)


def test_the_planted_circuit_is_recovered():
    """Every method tells the planted edges from the decoys' (ROC AUC 1: the decoys' effects
    are zero by construction) and ACDC keeps exactly the planted edges."""
    model = planted_circuit_vit()
    x, labels, flipped = planted_images(8)
    with torch.no_grad():
        assert torch.equal(model(x).argmax(1), labels)
    for options in ({"heads": False}, {}, {"method": "eap-ig"}):
        scored = attribution_patching(model, x, flipped, target=labels, progress=False, **options)
        truth = planted_edges(scored.upstream, scored.downstream)
        assert recovery_auc(scored.edges.mean(0), truth) == 1.0
    exact = exact_patching(model, x, flipped, target=labels, progress=False)
    assert recovery_auc(exact.edges.mean(0), planted_edges(exact.upstream, exact.downstream)) == 1
    found = acdc(model, x, flipped, heads=False, progress=False)
    assert torch.equal(found.edges, planted_edges(found.upstream, found.downstream))
    assert found.options["runs"] == 15 + 3 and found.nodes() == ["embed", "blocks.0 attn",
                                                                 "blocks.1 mlp"]  # fmt: skip
    by_heads = acdc(model, x, flipped, progress=False)
    assert torch.equal(by_heads.edges, planted_edges(by_heads.upstream, by_heads.downstream))
    assert by_heads.nodes() == ["embed", "blocks.0 head 0", "blocks.1 mlp"]


def test_acdc_removes_what_changes_nothing_and_everything_past_any_threshold():
    model, clean, corrupted = _vit(depth=2)
    kept = acdc(model, clean, corrupted, threshold=0.0, heads=False, progress=False)
    embed, output = kept.upstream.index("embed"), kept.downstream.index("output")
    assert not kept.edges[embed, output]  # the class token is the same in both: no effect
    assert kept.scores[embed, output] == 0 and len(kept) > 5
    none = acdc(model, clean, corrupted, threshold=float("inf"), progress=False)  # by heads
    assert len(none) == 0
    with torch.no_grad():
        expected = torch.nn.functional.kl_div(
            model(corrupted).log_softmax(-1), model(clean).log_softmax(-1), log_target=True,
            reduction="batchmean",
        )  # fmt: skip
    assert abs(none.options["loss"] - float(expected)) < 1e-4 * max(1.0, float(expected))
    by_score = acdc(model, clean, corrupted, threshold=0.0, metric="score", progress=False)
    assert by_score.options["metric"] == "score" and by_score.edges.any()
    with pytest.raises(ValueError, match="threshold"):
        acdc(model, clean, corrupted, threshold=-1, progress=False)


def test_the_guide_example_prints_what_the_guide_says():
    printed, said = run_first_example("circuits.md")
    assert printed == said


def test_the_circuit_figure_draws_the_edges_it_says():
    model = planted_circuit_vit()
    x, labels, flipped = planted_images(8)
    scored = attribution_patching(model, x, flipped, target=labels, progress=False)
    figure = vk.viz.circuit_figure(scored, edges=5)
    drawn = _edges_drawn(figure)
    assert len(drawn) == 5 and "the 5 largest of 21 edges" in figure.layout.title.text
    assert "blocks.0 head 0 → blocks.1 mlp in" in drawn
    nodes = next(t for t in figure.data if t.mode == "markers" and len(t.x) == 7)
    assert list(nodes.x) == [0, 1, 1, 2, 3, 3, 4] and max(nodes.marker.size) == 34
    found = acdc(model, x, flipped, progress=False)
    drawn = vk.viz.circuit_figure(found)
    assert len(_edges_drawn(drawn)) == 3
    assert "ACDC, threshold 0.01" in drawn.layout.title.text


def _edges_drawn(figure) -> set[str]:
    """The "upstream → input" names of the edges a circuit figure draws (its lines' hovers)."""
    lines = [t for t in figure.data if t.mode == "lines"]
    return {text.split(":")[0] for t in lines for text in t.text if text}


@pytest.mark.parametrize(
    "library, name, heads",
    [
        ("transformers", "ViTForImageClassification", True),
        ("open_clip", "CLIP visual tower (zero-shot)", True),  # fused: heads by weights x values
        ("torchvision", "VisionTransformer (vit_b_16)", True),
    ],
)
def test_other_libraries(library, name, heads):
    """EAP-IG tracks exact patching (r 0.87 to 0.999 measured), and a circuit without one edge
    equals exact patching of it, on each library's ViT (open_clip's tower by the embedding's
    norm: a backbone)."""
    from vizkit.models.representatives import LIBRARIES

    built = LIBRARIES[library][name]
    torch.manual_seed(0)
    model = built.build().eval()
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, 3, built.size, built.size, generator=generator)
    target = vk.targets.embedding_norm() if library == "open_clip" else 1
    ig = attribution_patching(model, x, y, target=target, heads=heads, method="eap-ig",
                              progress=False)  # fmt: skip
    exact = exact_patching(model, x, y, target=target, heads=heads, progress=False)
    assert agreement(ig, exact, "edges").correlation > 0.8
    kept = circuit(ig, 1.0)
    kept.edges[1, 2] = False
    torch.testing.assert_close(kept.run(model, x, y, target=target) - exact.clean_score,
                               exact.edges[:, 1, 2], rtol=1e-4, atol=1e-5)  # fmt: skip


def test_a_users_wrapper_is_read_through_its_own_forward():
    """A wrapper that doubles the model's logits doubles every effect, under its own names."""
    model, clean, corrupted = _vit(depth=2)

    class Doubled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.backbone = inner

        def forward(self, x):
            return 2 * self.backbone(x)

    bare = attribution_patching(model, clean, corrupted, progress=False)
    wrapped = attribution_patching(Doubled(model).eval(), clean, corrupted, progress=False)
    assert wrapped.upstream[1] == "backbone.blocks.0 head 0"
    torch.testing.assert_close(wrapped.edges, 2 * bare.edges, equal_nan=True)


def _block_output_and_gradient(model, x, labels):
    """Block 2's output (B, N, C) on x and the gradient of the labels' logits at it, read with
    a plain forward hook."""
    seen = {}

    def keep(module, args, output):
        output.retain_grad()
        seen["a"] = output

    handle = model.blocks[2].register_forward_hook(keep)
    try:
        model(x).gather(1, labels[:, None]).sum().backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    return seen["a"].detach(), seen["a"].grad


def test_feature_nodes_are_the_first_order_terms_written_out(shapes_sae):
    """Marks et al. 2025: latent i's effect is (z_i(corrupted) - z_i(clean)) (W_dec[i] / s) .
    dM/da over its tokens, the error term's (e(corrupted) - e(clean)) . dM/da; together the
    whole activation's."""
    model, sae = shapes_sae
    clean, removed, labels, _ = vk.datasets.counterfactual_shapes(4, replace="none")
    found = vk.circuits.feature_attribution(model, clean, removed, sae, target=labels,
                                            progress=False)  # fmt: skip
    a_clean, gradient = _block_output_and_gradient(model, clean, labels)
    a_removed, _ = _block_output_and_gradient(model, removed, labels)
    with torch.no_grad():
        through = gradient @ sae.W_dec.T / sae.input_scale  # dM/dz
        expected = ((sae.encode(a_removed) - sae.encode(a_clean)) * through).sum(1)
        whole = ((a_removed - a_clean) * gradient).sum((1, 2))
    torch.testing.assert_close(found.latents[0], expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(found.total[:, 0], whole, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(found.latents[0].sum(1) + found.error[:, 0], found.total[:, 0],
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    assert found.layers == ["blocks.2.hook_resid_post"] and len(found.top(0, 3)) == 3
    assert all(p.grad is None for p in model.parameters())
    other, _ = _vit(depth=2)[:2]
    with pytest.raises(ValueError, match="trained on blocks.2.hook_resid_post of another model"):
        vk.circuits.feature_attribution(other, clean, removed, sae, progress=False)
