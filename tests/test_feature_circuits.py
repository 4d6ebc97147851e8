"""Feature circuits (Marks et al. 2025, "Sparse Feature Circuits"): edges between the latents of
two autoencoders, exact latent patching, and a feature circuit's faithfulness, on the Shapes ViT
with two autoencoders trained in seconds, checked against computations written out with plain
forward hooks."""

from __future__ import annotations

import pytest
import torch

import vizkit as vk
from vizkit.circuits.feature_circuit import feature_circuit, feature_faithfulness
from vizkit.circuits.feature_edges import feature_edges
from vizkit.circuits.feature_patching import exact_feature_patching, feature_agreement


@pytest.fixture(scope="module")
def two_saes(tmp_path_factory):
    """The shipped Shapes ViT and autoencoders on its block 1 and block 2 outputs."""
    model, _ = vk.zoo.load("vit_tiny_shapes")
    x = vk.datasets.load_sample()[0][:32]
    saes = []
    for layer in (-3, -2):
        folder = tmp_path_factory.mktemp("store") / "s"
        store = vk.cache_activations(model, x, folder, layers=[layer], tokens="all",
                                     progress=False)  # fmt: skip
        saes.append(vk.train_sae(store, expansion=2, k=8, tokens=5 * len(store), batch_size=256,
                                 progress=False))  # fmt: skip
    return model, saes


@pytest.fixture(scope="module")
def pairs():
    clean, removed, labels, _ = vk.datasets.counterfactual_shapes(4, replace="none")
    return clean, removed, labels


def _state(model):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            [m.training for m in model.modules()])  # fmt: skip


def _left_as_it_was(model, before):
    state, modes = before
    after = model.state_dict()
    assert all(torch.equal(state[k], after[k]) for k in state)
    assert [m.training for m in model.modules()] == modes
    assert all(p.grad is None for p in model.parameters())
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks


def _block_output_and_gradient(model, x, labels, block):
    """The block's output (B, N, C) on x and the gradient of the labels' logits at it."""
    seen = {}

    def keep(module, args, output):
        output.retain_grad()
        seen["a"] = output

    handle = model.blocks[block].register_forward_hook(keep)
    try:
        model(x).gather(1, labels[:, None]).sum().backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    return seen["a"].detach(), seen["a"].grad


def test_edges_are_the_jacobian_between_the_layers_written_out(two_saes, pairs):
    """Edge (i -> j) = sum over tokens of dM/dz_j (dz_j / da_up) (dz_i W_dec[i] / s), with the
    Jacobian of block 2 on block 1's output taken by torch.autograd.functional.jacobian."""
    model, (up, down) = two_saes
    clean, removed, labels = pairs
    clean, removed, labels = clean[:2], removed[:2], labels[:2]
    before = _state(model)
    found = feature_edges(model, clean, removed, [down, up], target=labels, k=3, progress=False)
    _left_as_it_was(model, before)
    assert found.layers == ["blocks.1.hook_resid_post", "blocks.2.hook_resid_post"]
    kept = found.kept[0]
    assert kept.shape == (3,) and found.edges[0].shape == (2, up.latents + 1, 4)
    a_up, _ = _block_output_and_gradient(model, clean, labels, 1)
    a_up_removed, _ = _block_output_and_gradient(model, removed, labels, 1)
    _, g_down = _block_output_and_gradient(model, clean, labels, 2)
    model.eval()
    with torch.no_grad():
        weight = g_down @ down.W_dec.T / down.input_scale  # dM/dz_down (B, N, K)
        dz_up = up.encode(a_up_removed) - up.encode(a_up)
        written = dz_up[..., None] * up.W_dec / up.input_scale  # (B, N, K_up, C)
    for b in range(2):
        jacobian = torch.autograd.functional.jacobian(
            lambda a: down.encode(model.blocks[2](a))[0][:, kept], a_up[b : b + 1]
        )[:, :, 0]  # (N, k, N, C)
        pulled = torch.einsum("nj,njmc->jmc", weight[b][:, kept], jacobian)  # (k, N, C)
        expected = torch.einsum("jmc,mic->ij", pulled, written[b])  # (K_up, k)
        torch.testing.assert_close(found.edges[0][b, :-1, :-1], expected, rtol=1e-3, atol=1e-5)
        whole = torch.einsum("jmc,mc->j", pulled, a_up_removed[b] - a_up[b])
        torch.testing.assert_close(found.whole[0][b, :-1], whole, rtol=1e-3, atol=1e-5)
    assert all(p.grad is None for p in model.parameters())


def test_edges_into_a_node_add_up_to_the_whole_upstream_activation(two_saes, pairs):
    """Marks et al.: the latents and error add up to the activation, so a downstream node's
    edges from every upstream latent and the error sum to the whole difference's; EAP-IG too."""
    model, saes = two_saes
    clean, removed, labels = pairs
    for method in ("eap", "eap-ig"):
        found = feature_edges(model, clean, removed, saes, target=labels, k=4, method=method,
                              steps=2, progress=False)  # fmt: skip
        edges, whole = found.edges[0], found.whole[0]
        scale = whole.abs().max()
        torch.testing.assert_close(edges.sum(1), whole, rtol=0, atol=1e-4 * scale + 1e-6)
        kept_effects = found.nodes.latents[1].mean(0).abs()
        assert len(found.kept[0]) == 4
        assert kept_effects[found.kept[0]].min() >= kept_effects.sort().values[-4] - 1e-9
        assert found.options == {"method": method, "steps": 1 if method == "eap" else 2, "k": 4}


def test_exact_patching_of_a_latent_is_the_run_written_out(two_saes, pairs):
    """Patching latent i adds (z_i(corrupted) - z_i(clean)) W_dec[i] / s at the tokens; the
    first-order effects track the exact ones."""
    model, (_, sae) = two_saes
    clean, removed, labels = pairs
    a_clean, _ = _block_output_and_gradient(model, clean, labels, 2)
    a_removed, _ = _block_output_and_gradient(model, removed, labels, 2)
    model.eval()
    with torch.no_grad():
        dz = sae.encode(a_removed) - sae.encode(a_clean)
    changed = dz.abs().sum((0, 1))
    latent = int(changed.argmax())
    moved = changed.nonzero()[:, 0].tolist()  # a latent that does not change has no effect
    before = _state(model)
    exact = exact_feature_patching(model, clean, removed, [sae], target=labels, latents=[moved],
                                   progress=False)  # fmt: skip
    _left_as_it_was(model, before)
    handle = model.blocks[2].register_forward_hook(
        lambda m, a, out: out + dz[..., latent : latent + 1] * sae.W_dec[latent] / sae.input_scale
    )
    try:
        with torch.no_grad():
            patched = model(clean).gather(1, labels[:, None])[:, 0]
    finally:
        handle.remove()
    torch.testing.assert_close(exact.latents[0][:, latent], patched - exact.clean_score,
                               rtol=1e-3, atol=1e-4)  # fmt: skip
    approximate = vk.circuits.feature_attribution(model, clean, removed, sae, target=labels,
                                                  progress=False)  # fmt: skip
    agree = feature_agreement(approximate, exact, k=10)
    assert agree.count == len(moved) and agree.correlation > 0.5
    assert exact.latents[0].isnan().sum() == 4 * (sae.latents - len(moved))
    assert exact.error.shape == exact.total.shape == (4, 1)
    assert torch.allclose(exact.total[:, 0], exact.corrupted_score - exact.clean_score, atol=1e-3)


def test_faithfulness_runs_from_the_corrupted_to_the_clean_score(two_saes, pairs):
    """Every latent kept (error kept): each activation is as it was, the clean score. No latent
    kept and the error patched: decode(z_corrupted) + e_corrupted is the corrupted activation at
    every token (the autoencoders read all), so the corrupted score."""
    model, saes = two_saes
    clean, removed, labels = pairs
    nodes = vk.circuits.feature_attribution(model, clean, removed, saes, target=labels,
                                            progress=False)  # fmt: skip
    before = _state(model)
    curve = feature_faithfulness(model, nodes, clean, removed, saes, progress=False)
    _left_as_it_was(model, before)
    torch.testing.assert_close(curve.scores[-1], nodes.clean_score, rtol=0, atol=1e-4)
    assert float(curve.faithfulness[-1]) == pytest.approx(1.0, abs=1e-4)
    assert float(curve.faithfulness[0]) == pytest.approx(0.0, abs=1e-6)
    patched = feature_faithfulness(model, nodes, clean, removed, saes, errors=False,
                                   sizes=[1], progress=False)  # fmt: skip
    torch.testing.assert_close(patched.scores[0], nodes.corrupted_score, rtol=0, atol=1e-3)
    circuit = feature_circuit(nodes, 5)
    assert len(circuit) == 5 and circuit.errors
    four = list(curve.sizes).index(4)
    torch.testing.assert_close(feature_circuit(nodes, 4).run(model, clean, removed, saes,
                                                             target=labels),
                               curve.scores[four], rtol=0, atol=1e-5)  # fmt: skip
    mean = feature_faithfulness(model, nodes, clean, removed, saes, reference="mean",
                                sizes=[], progress=False)  # fmt: skip
    torch.testing.assert_close(mean.scores[-1], nodes.clean_score, rtol=0, atol=1e-4)


def test_refusals_leave_the_model_as_it_was(two_saes, pairs):
    model, (up, down) = two_saes
    clean, removed, labels = pairs
    before = _state(model)
    other = vk.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, depth=2,
                            img_size=32, patch_size=4, embed_dim=32, num_heads=2)  # fmt: skip
    with pytest.raises(ValueError, match="of another model"):
        feature_edges(other.eval(), clean, removed, [up, down], progress=False)
    with pytest.raises(ValueError, match="Two autoencoders read blocks.2.hook_resid_post"):
        feature_edges(model, clean, removed, [down, down], progress=False)
    with pytest.raises(ValueError, match="two or more"):
        feature_edges(model, clean, removed, [down], progress=False)
    with pytest.raises(ValueError, match="k must be"):
        feature_edges(model, clean, removed, [up, down], k=0, progress=False)
    with pytest.raises(ValueError, match="pass those autoencoders"):
        nodes = vk.circuits.feature_attribution(model, clean, removed, [up, down], progress=False)
        feature_faithfulness(model, nodes, clean, removed, [down, up], progress=False)
    _left_as_it_was(model, before)


class _Wrapper(torch.nn.Module):
    """A user's module around the Shapes ViT."""

    def __init__(self, inner):
        super().__init__()
        self.backbone = inner

    def forward(self, x):
        return self.backbone(x)


@pytest.mark.parametrize(
    "library, name",
    [
        ("transformers", "ViTForImageClassification"),
        ("torchvision", "VisionTransformer (vit_b_16)"),
        ("open_clip", "CLIP visual tower (zero-shot)"),  # a backbone: its embedding's norm
        ("wrapper", ""),
    ],
)
def test_feature_circuits_on_other_libraries(library, name, tmp_path):
    """Edges, exact patching and faithfulness on each library's ViT with autoencoders on its
    first two blocks: a downstream node's edges add up to the whole upstream activation's, and
    every latent kept with the errors in place gives the clean score."""
    from vizkit.models.representatives import LIBRARIES

    torch.manual_seed(0)
    if library == "wrapper":
        model, size = _Wrapper(vk.zoo.load("vit_tiny_shapes")[0]).eval(), 32
    else:
        built = LIBRARIES[library][name]
        model, size = built.build().eval(), built.size
    x = torch.randn(12, 3, size, size, generator=torch.Generator().manual_seed(0))
    saes = []
    for layer in (0, 1):
        store = vk.cache_activations(model, x, tmp_path / f"s{layer}", layers=[layer],
                                     tokens="all", progress=False)  # fmt: skip
        saes.append(vk.train_sae(store, expansion=1, k=4, tokens=4 * len(store),
                                 batch_size=min(64, len(store)), progress=False))  # fmt: skip
    target = vk.targets.embedding_norm() if library == "open_clip" else 1
    clean, corrupted = x[:2], x[2:4]
    before = _state(model)
    found = feature_edges(model, clean, corrupted, saes, target=target, k=3, progress=False)
    torch.testing.assert_close(found.edges[0].sum(1), found.whole[0], rtol=1e-3, atol=1e-5)
    exact = exact_feature_patching(model, clean, corrupted, saes, target=target,
                                   latents=[[0], [0]], progress=False)  # fmt: skip
    gap = exact.corrupted_score - exact.clean_score
    torch.testing.assert_close(exact.total[:, 0], gap, rtol=1e-3, atol=1e-4)
    curve = feature_faithfulness(model, found.nodes, clean, corrupted, saes, target=target,
                                 sizes=[2], progress=False)  # fmt: skip
    torch.testing.assert_close(curve.scores[-1], found.nodes.clean_score, rtol=0, atol=1e-4)
    _left_as_it_was(model, before)
