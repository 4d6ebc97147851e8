"""Direct logit attribution, the logit lens, activation patching and ablation against a
hand-written recompute of a two-block ViT and against explicit loops that edit one activation
per forward (the head's output edited at its projection's input, independently of vizkit's
per-head split); refusals where the stream is not one sum or the head not affine."""

from __future__ import annotations

import pytest
import torch
from conftest import build, model_state, torchvision_vit
from representatives import drawn, representatives

import vizkit as vk
from vizkit import coverage
from vizkit.hooks.scores import model_logits

timm = pytest.importorskip("timm")


def _two_block_vit():
    """A seeded timm ViT (32 px, patches of 8, width 32, 4 heads, 2 blocks, 5 classes), its
    norms' and head's parameters drawn so that none is an identity."""
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, num_heads=4, depth=2,
        num_classes=5,
    ).eval()  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.startswith("head"):
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.3)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return model, x


def _recompute(model, x):
    """By hand: the stream entering the blocks, each head's W_O^h z_h and bias, each MLP output,
    and the final stream."""
    with torch.no_grad():
        stream = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        parts, heads = [stream], []
        for block in model.blocks:
            attn = block.attn
            batch, tokens, width = stream.shape
            qkv = attn.qkv(block.norm1(stream)).view(batch, tokens, 3, attn.num_heads, -1)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            weights = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)
            z = weights @ v  # (B, H, N, d)
            slices = attn.proj.weight.view(width, attn.num_heads, -1)  # (C, H, d)
            per_head = torch.einsum("bhnd,chd->hbnc", z, slices)
            heads.append(per_head)
            attn_out = per_head.sum(0) + attn.proj.bias
            stream = stream + attn_out
            mlp_out = block.mlp(block.norm2(stream))
            stream = stream + mlp_out
            parts += [attn_out, mlp_out]
    return torch.stack(parts), torch.stack(heads), stream


def test_direct_logit_attribution_equals_a_hand_recompute():
    """With the final norm's scale frozen (its value on the clean class token), each part's
    contribution is w_t . (γ ⊙ (part_cls - mean) / σ) and the constant w_t . β + b_t."""
    model, x = _two_block_vit()
    result = vk.direct_logit_attribution(model, x, target=2, versus=4)
    parts, heads, final = _recompute(model, x)
    cls = final[:, 0]
    sigma = (cls.var(-1, unbiased=False, keepdim=True) + model.norm.eps).sqrt()
    w = model.head.weight[2] - model.head.weight[4]

    def direct(part):  # (..., B, C) at the class token -> (..., B)
        centred = part - part.mean(-1, keepdim=True)
        return (centred / sigma * model.norm.weight * w).sum(-1)

    with torch.no_grad():
        expected = direct(parts[:, :, 0]).T  # (B, P)
        constant = (model.norm.bias * w).sum() + model.head.bias[2] - model.head.bias[4]
        logits = model(x)
    torch.testing.assert_close(result.contributions, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(result.constant, constant.expand(3), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(result.score, logits[:, 2] - logits[:, 4])
    torch.testing.assert_close(result.contributions.sum(1) + result.constant, result.score,
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    assert result.per_position[:, :, 1:].abs().max() == 0  # the head reads the class token
    with torch.no_grad():
        by_head = direct(heads[:, :, :, 0]).permute(2, 0, 1)  # (B, L, H)
    torch.testing.assert_close(result.heads, by_head, rtol=1e-4, atol=1e-5)
    assert result.parts[:3] == ["embed", "blocks.0 attn", "blocks.0 mlp"]
    assert result.top_heads(1)[0][:2] == max(
        ((f"blocks.{layer}", h) for layer in range(2) for h in range(4)),
        key=lambda lh: by_head[:, int(lh[0][-1]), lh[1]].mean().abs(),
    )  # fmt: skip


def test_direct_logit_attribution_on_pooled_and_other_library_models():
    """Averaged patches with a register token and LayerScale (timm), and torchvision's ViT:
    the parts sum to the logit; the model is left as it was. torchvision's attention computes
    its output inside one function, so its map cannot be edited and its heads are not split
    (the note says so), nor does it call its output projection as a module."""
    for model, x in (build("vit_reg_avg"), (torchvision_vit(), torch.randn(2, 3, 32, 32))):
        before = model_state(model)
        result = vk.direct_logit_attribution(model, x)
        torch.testing.assert_close(result.contributions.sum(1) + result.constant, result.score,
                                   rtol=1e-4, atol=1e-4)  # fmt: skip
        assert model_state(model) == before
        if result.heads is None:
            assert "No output projection" in result.notes["heads"]
        else:  # timm, averaging the patches: they carry every contribution, the register none
            assert torch.isfinite(result.heads).all()
            assert result.per_position[:, :, 0].abs().max() == 0
            assert (result.per_position[:, :, 1:].abs().sum((0, 1)) > 0).all()
    assert result.heads is None  # torchvision
    assert result.per_position.abs().sum((0, 1)).nonzero().tolist() == [[0]]  # class token


def test_the_views_refuse_models_they_cannot_read():
    model, x = build("resnet")
    with pytest.raises(ValueError, match="no transformer blocks"):
        vk.direct_logit_attribution(model, x)
    swin = timm.create_model("swin_tiny_patch4_window7_224", img_size=64, window_size=4,
                             depths=(1, 1), num_heads=(1, 2), embed_dim=16).eval()  # fmt: skip
    with pytest.raises(ValueError, match="differ in shape"):
        vk.direct_logit_attribution(swin, torch.randn(1, 3, 64, 64))
    lens = vk.logit_lens(swin, torch.randn(1, 3, 64, 64))  # its last stage only
    assert (
        lens.layers == ["layers.1.blocks.0"] and "embed, layers.0.blocks.0" in lens.notes["skipped"]
    )
    vit_map, x = build("vit_map")  # an attention-pooling head
    with pytest.raises(ValueError, match="not affine"):
        vk.direct_logit_attribution(vit_map, x)
    lens = vk.logit_lens(vit_map, x)  # the lens reads the head unfrozen: it applies
    torch.testing.assert_close(lens.pooled[:, -1], vit_map(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="not a callable"):
        vk.direct_logit_attribution(*_two_block_vit(), target=lambda out: out[:, 0])


def test_logit_lens_is_the_head_on_each_token():
    model, x = _two_block_vit()
    lens = vk.logit_lens(model, x)
    parts, _, final = _recompute(model, x)
    streams = [parts[0], parts[:3].sum(0), final]
    with torch.no_grad():
        for layer, stream in enumerate(streams):
            expected = model.head(model.norm(stream))  # every token alone, as if the class token
            torch.testing.assert_close(lens.per_position[:, layer], expected, rtol=1e-4,
                                       atol=1e-5)  # fmt: skip
        torch.testing.assert_close(lens.pooled[:, -1], model(x), rtol=1e-4, atol=1e-5)
    assert lens.layers == ["embed", "blocks.0", "blocks.1"]
    probabilities = lens.per_position[:, :, 1:].softmax(-1)[..., 0]
    torch.testing.assert_close(lens.maps(0), probabilities.view(3, 3, 4, 4))
    assert (lens.first_decodable() <= 2).all()


def _explicit(model, x, edit):
    """The target score of one forward of x with ``edit(model)`` hooks (removed after)."""
    handles = edit(model)
    try:
        with torch.no_grad():
            return model_logits(model(x))
    finally:
        for handle in handles:
            handle.remove()


def _head_input(block, head, value_of):
    """A pre-hook on ``block``'s attention projection replacing head ``head``'s slice of its
    input (B, N, H * d) by ``value_of(slice)``."""
    attn = block.attn
    width = attn.proj.in_features // attn.num_heads

    def pre(module, args):
        z = args[0].clone()
        z[..., head * width : (head + 1) * width] = value_of(z[..., head * width :
                                                               (head + 1) * width])  # fmt: skip
        return (z,)

    return [attn.proj.register_forward_pre_hook(pre)]


def _capture_head_inputs(model, x):
    """(L, B, N, H * d) each block's projection input on x."""
    seen = []
    handles = [b.attn.proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
               for b in model.blocks]  # fmt: skip
    _explicit(model, x, lambda m: handles)
    return torch.stack(seen)


def test_patching_equals_explicit_loops():
    model, clean = _two_block_vit()
    corrupted = clean.flip(0) + 0.5 * torch.randn_like(clean)
    result = vk.activation_patching(model, clean, corrupted, target=1, versus=3,
                                    batch_size=7, progress=False)  # fmt: skip
    hm = vk.HookedModel(model)

    def score(logits):
        return logits[:, 1] - logits[:, 3]

    with torch.no_grad():
        _, cache = hm.run_with_cache(clean, ["blocks.*.hook_resid_pre", "blocks.*.hook_mlp_out"])
        high, low = score(model(clean)), score(model(corrupted))
    torch.testing.assert_close(result.clean_score, high)
    for layer, position in ((0, 0), (1, 5), (1, 16)):
        name = f"blocks.{layer}.hook_resid_pre"

        def patch(t, *, name, position=position):
            t = t.clone()
            t[:, position] = cache[name][:, position]
            return t

        with torch.no_grad(), hm.hooks(fwd={name: patch}):
            patched = score(model(corrupted))
        torch.testing.assert_close(result.resid[:, layer, position], (patched - low) / (high - low),
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
    mlp = "blocks.1.hook_mlp_out"
    with torch.no_grad(), hm.hooks(fwd={mlp: lambda t, *, name: cache[mlp]}):
        patched = score(model(corrupted))
    torch.testing.assert_close(result.mlp[:, 1], (patched - low) / (high - low), rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    clean_z = _capture_head_inputs(model, clean)
    width = model.blocks[0].attn.proj.in_features // 4
    for layer, head in ((0, 2), (1, 3)):
        own = clean_z[layer][..., head * width : (head + 1) * width]
        logits = _explicit(model, corrupted,
                           lambda m, layer=layer, head=head, own=own: _head_input(
                               m.blocks[layer], head, lambda z: own))  # fmt: skip
        expected = (score(logits) - low) / (high - low)
        torch.testing.assert_close(result.heads[:, layer, head], expected, rtol=1e-4, atol=1e-5)
    assert result.resid.shape == (3, 2, 17) and result.heads.shape == (3, 2, 4)


def test_patched_runs_fill_passes_by_bytes(monkeypatch):
    """Without batch_size, each forward holds as many copies of the batch as the byte budget
    allows (one image's forward measured), and the scores equal those of one copy per pass."""
    from vizkit.analysis import component_edits
    from vizkit.hooks.passes import one_image_bytes

    model, clean = _two_block_vit()
    corrupted = clean.flip(0) + 0.5 * torch.randn_like(clean)
    sites = ("resid", "mlp")  # (heads are split in a forward of copies of their own)
    one = vk.activation_patching(model, clean, corrupted, target=1, sites=sites,
                                 batch_size=len(clean), progress=False)  # fmt: skip
    per_image = one_image_bytes(model, clean, gradients=False)
    monkeypatch.setattr(component_edits, "EDITED_BYTES", 7 * per_image)
    seen = []
    handle = model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(len(args[0])))
    try:
        sized = vk.activation_patching(model, clean, corrupted, target=1, sites=sites,
                                       progress=False)  # fmt: skip
    finally:
        handle.remove()
    assert max(seen) == 2 * len(clean)  # 7 images' budget: two copies of the 3 images
    torch.testing.assert_close(sized.resid, one.resid, rtol=0, atol=1e-3)  # shares of the gap


def test_ablation_equals_explicit_loops():
    model, x = _two_block_vit()
    labels = torch.tensor([0, 1, 2])
    zero = vk.ablation(model, x, "heads", labels=labels, target=labels, progress=False)
    with torch.no_grad():
        clean = model(x).gather(1, labels[:, None])[:, 0]
    for layer, head in ((0, 1), (1, 0)):
        logits = _explicit(model, x, lambda m, layer=layer, head=head: _head_input(
            m.blocks[layer], head, torch.zeros_like))  # fmt: skip
        index = zero.labels.index(f"blocks.{layer} head {head}")
        torch.testing.assert_close(zero.change[:, index],
                                   logits.gather(1, labels[:, None])[:, 0] - clean,
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
        assert zero.accuracy[index] == (logits.argmax(-1) == labels).float().mean()
    reference = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    mean = vk.ablation(model, x, "mlp", mode="mean", reference=reference, target=labels,
                       progress=False)  # fmt: skip
    hm = vk.HookedModel(model)
    with torch.no_grad():
        _, ref = hm.run_with_cache(reference, "blocks.0.hook_mlp_out")
        average = ref["blocks.0.hook_mlp_out"].mean(0)
        with hm.hooks(fwd={"blocks.0.hook_mlp_out": lambda t, *, name: average.expand_as(t)}):
            ablated = model(x).gather(1, labels[:, None])[:, 0]
    torch.testing.assert_close(mean.change[:, 0], ablated - clean, rtol=1e-4, atol=1e-5)
    resample = vk.ablation(model, x, "positions", mode="resample", reference=reference,
                           progress=False)  # fmt: skip
    assert resample.change.shape == (3, 17) and resample.ranking()[0][0].startswith("position")
    with pytest.raises(ValueError, match="mode"):
        vk.ablation(model, x, "heads", mode="noise")


@pytest.mark.slow
@pytest.mark.parametrize(("make", "size"), representatives())
def test_mechanistic_views_on_every_family(make, size):
    """On each representative of docs/coverage.md, each view either runs (the attribution
    summing to the logit, the lens's last reading the model's output) or refuses with a
    ValueError that says why; the model is left as it was."""
    model = drawn(make)
    x = coverage._images(model, size)[:2]
    before = model_state(model)
    try:
        result = vk.direct_logit_attribution(model, x)
    except ValueError as error:
        assert str(error)
    else:
        torch.testing.assert_close(result.contributions.sum(1) + result.constant, result.score,
                                   rtol=1e-3, atol=1e-3)  # fmt: skip
    try:
        lens = vk.logit_lens(model, x)
    except ValueError as error:
        assert str(error)
    else:
        with torch.no_grad():
            logits = model_logits(model(x))
        torch.testing.assert_close(lens.pooled[:, -1], logits.float(), rtol=1e-3, atol=1e-3)
        ablated = vk.ablation(model, x, "mlp", progress=False)
        assert torch.isfinite(ablated.change).all()
    assert model_state(model) == before


def test_patching_and_ablation_name_each_site_alike():
    """One vocabulary of sites: "positions" is the first block's row of "resid" in both, and an
    ablation from the clean images themselves ("resample" of a batch of one, its own image)
    changes nothing, as patching the clean run into itself would restore it all."""
    model, clean = _two_block_vit()
    corrupted = clean.flip(0) + 0.5 * torch.randn_like(clean)
    patched = vk.activation_patching(model, clean, corrupted, target=1,
                                     sites=("resid", "positions"), progress=False)  # fmt: skip
    # the same edits, run in other chunks of copies: equal to float noise (shares of ~1)
    torch.testing.assert_close(patched.positions, patched.resid[:, 0], rtol=1e-3, atol=1e-3)
    every = vk.ablation(model, clean, "resid", target=1, progress=False)
    first = vk.ablation(model, clean, "positions", target=1, progress=False)
    tokens = first.change.shape[1]
    scale = float(first.score.abs().max())
    torch.testing.assert_close(every.change[:, :tokens], first.change, rtol=1e-3,
                               atol=1e-4 * scale)  # fmt: skip
    assert every.labels[tokens] == "blocks.1 position 0" and first.labels[0] == "position 0"
    for site in ("attn", "heads"):
        own = vk.ablation(model, clean[:1], site, mode="resample", target=1, progress=False)
        assert own.change.abs().max() < 1e-4 * own.score.abs().max().clamp_min(1)
    figure = vk.viz.patching_maps(
        vk.activation_patching(
            model, clean, corrupted, target=1, sites="positions", progress=False
        )  # fmt: skip
    )
    assert figure.data[0].y == ("blocks.0",) and len(figure.data[0].x) == tokens


def test_patching_a_region_back_at_the_first_block_restores_everything():
    """The object erased: only the patches it touches differ, so patching them into the first
    block's input restores the clean score exactly; at a later block it equals the explicit
    edit of those tokens."""
    model, clean = _two_block_vit()
    region = torch.zeros(3, 32, 32, dtype=torch.bool)
    region[:, 4:13, 9:20] = True  # touches patches rows 0-1, cols 1-2
    corrupted = clean.masked_fill(region[:, None], 0.0)
    result = vk.activation_patching(model, clean, corrupted, sites=("mlp",), region=region,
                                    progress=False)  # fmt: skip
    torch.testing.assert_close(result.region[:, 0], torch.ones(3), rtol=1e-4, atol=1e-4)
    hm = vk.HookedModel(model)
    name = "blocks.1.hook_resid_pre"
    with torch.no_grad():
        _, cache = hm.run_with_cache(clean, name)
    tokens = [1 + r * 4 + c for r in (0, 1) for c in (1, 2)]  # after the class token

    def patch(t, *, name):
        t = t.clone()
        t[:, tokens] = cache[name][:, tokens]
        return t

    with torch.no_grad(), hm.hooks(fwd={name: patch}):
        patched = model(corrupted).gather(1, result.targets[:, None])[:, 0]
    expected = (patched - result.corrupted_score) / (result.clean_score - result.corrupted_score)
    torch.testing.assert_close(result.region[:, 1], expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="patch grid"):
        vk.activation_patching(model, clean, corrupted, region=region[:, :5], progress=False)


def test_attribution_and_patching_equal_transformer_lens():
    """On a transformers ViT (every parameter drawn, so no norm is an identity and no bias
    zero), TransformerLens's logit attributions of the embedding and each attention and MLP
    output equal vizkit's, and so do the heads' (TransformerLens through its hook_z and W_O;
    vizkit zeroes the other heads' slices of the output projection's input, as this family's
    attention map is computed beside its output). Patching the stream entering a layer at one
    position gives TransformerLens's patched logits (its run_with_hooks, one run per site);
    zero-ablating a head changes the logit as zeroing its hook_z there does."""
    pytest.importorskip("transformer_lens")
    transformers = pytest.importorskip("transformers")
    from tl_oracle import tl_head_ablation, tl_logit_attribution, tl_resid_patching

    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, num_labels=5)  # fmt: skip
    model = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    theirs = tl_logit_attribution(model, x, target=4)
    ours = vk.direct_logit_attribution(model, x, target=4)
    torch.testing.assert_close(theirs["logits"], model(pixel_values=x).logits, rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    torch.testing.assert_close(ours.contributions, theirs["parts"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.heads, theirs["heads"], rtol=1e-4, atol=1e-5)
    corrupted = x.flip(0)
    patching = vk.activation_patching(model, x, corrupted, target=4, sites=("resid",),
                                      progress=False)  # fmt: skip
    sites = [(0, 0), (1, 3), (1, 16)]
    patched = tl_resid_patching(model, x, corrupted, sites)[..., 4]  # (S, B)
    for (layer, position), scores in zip(sites, patched, strict=True):
        torch.testing.assert_close(patching.scores["resid"][:, layer, position], scores,
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
    ablated = vk.ablation(model, x, "heads", target=4, progress=False)
    heads = [(0, 1), (1, 3)]
    zeroed = tl_head_ablation(model, x, heads)[..., 4]  # (S, B)
    clean = model(pixel_values=x).logits[:, 4]
    for (layer, head), scores in zip(heads, zeroed, strict=True):
        index = ablated.labels.index(f"vit.layers.{layer} head {head}")
        torch.testing.assert_close(ablated.change[:, index], scores - clean, rtol=1e-4,
                                   atol=1e-5)  # fmt: skip


def test_the_views_refuse_what_they_would_get_wrong():
    """A max-pooling head (piecewise linear: affine at the image, not additive over the parts),
    talking heads (mixed after the softmax: the map's heads are not the output's), a stream
    whose tokens are not the model's grid (ConViT's class token joins late), references of
    another size, and a model that outputs NaN are refused, each with the reason."""
    torch.manual_seed(0)
    maxpool = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32,
                                depth=2, num_heads=4, num_classes=5, global_pool="max",
                                class_token=False).eval()  # fmt: skip
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match="not additive"):
        vk.direct_logit_attribution(maxpool, x)
    cait = timm.create_model("cait_xxs24_224", img_size=32, patch_size=8, embed_dim=32, depth=2,
                             num_heads=4, depth_token_only=1, num_classes=5).eval()  # fmt: skip
    with pytest.raises(ValueError, match="mixed after the softmax"):
        vk.ablation(cait, x, "heads", progress=False)
    convit = timm.create_model("convit_tiny", img_size=32, patch_size=8, embed_dim=8,
                               num_heads=4, depth=2, local_up_to_layer=1,
                               num_classes=5).eval()  # fmt: skip
    with pytest.raises(ValueError, match="do not line up"):
        vk.activation_patching(convit, x, x.flip(0), sites=("resid",), progress=False)
    with pytest.raises(ValueError, match="do not line up"):
        vk.ablation(convit, x, "positions", progress=False)
    dynamic = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32,
                                depth=2, num_heads=4, num_classes=5,
                                dynamic_img_size=True).eval()  # fmt: skip
    with pytest.raises(ValueError, match="reference images must be"):
        vk.ablation(dynamic, x, "positions", mode="mean", reference=torch.randn(3, 3, 24, 24),
                    progress=False)  # fmt: skip
    model, _ = _two_block_vit()
    with torch.no_grad():
        model.blocks[1].mlp.fc2.bias[0] = float("inf")
    for view in (lambda: vk.direct_logit_attribution(model, x), lambda: vk.logit_lens(model, x),
                 lambda: vk.ablation(model, x, "mlp", progress=False)):  # fmt: skip
        with pytest.raises(ValueError, match="NaN or infinite"):
            view()


def test_heads_split_at_the_output_projection_equal_the_map_split():
    """transformers' Data2Vec-Vision: with eager attention vizkit zeroes heads in the map, with
    sdpa (the map computed beside) at the output projection's input, which must be the
    projection (not the values' Linear, whose input the queries' and keys' share)."""
    from test_transformers_swin_beit import build as build_hf
    from test_transformers_swin_beit import images as hf_images

    x = hf_images(2)
    eager = vk.direct_logit_attribution(build_hf("data2vec", "eager"), x)
    sdpa = vk.direct_logit_attribution(build_hf("data2vec", "sdpa"), x)
    assert eager.heads is not None and sdpa.heads is not None
    torch.testing.assert_close(sdpa.heads, eager.heads, rtol=1e-4, atol=1e-6)


def test_half_precision_is_refused_by_the_additive_views_with_a_fix_that_runs():
    """DLA and head splits check sums to 1e-4, which bfloat16 rounding exceeds: the refusal
    says so (not "not linear in its heads") and its fix, float32, runs."""
    import timm

    model = timm.create_model("vit_tiny_patch16_224", num_classes=5, img_size=32, patch_size=8,
                              depth=1).eval()  # fmt: skip
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    half, half_x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"Run it in float32: model\.float\(\) and x\.float\(\)"):
        vk.direct_logit_attribution(half, half_x, target=1)
    with pytest.raises(ValueError, match="Splitting attention outputs by head"):
        vk.ablation(half, half_x, component="heads", target=1, progress=False)
    assert vk.direct_logit_attribution(half.float(), half_x.float(), target=1).heads is not None


def _drawn_patching(sites, blocks=4, heads=4, grid=(8, 8), prefix=1):
    """A PatchingResult of seeded shares (clean score 1, corrupted 0: each score is its share)
    over ``sites``, shaped as a ViT's of ``blocks`` blocks, ``heads`` heads and a ``grid`` of
    patches after ``prefix`` tokens: a figure's layout without a model's runs."""
    from vizkit.analysis.patching import PatchingResult
    from vizkit.hooks.layout import TokenLayout

    generator = torch.Generator().manual_seed(0)
    tokens = prefix + grid[0] * grid[1]
    shapes = {"resid": (blocks, tokens), "positions": (tokens,), "attn": (blocks,),
              "mlp": (blocks,), "heads": (blocks, heads)}  # fmt: skip
    shares = {s: torch.randn(2, *shapes[s], generator=generator) / 3 for s in sites}
    return PatchingResult(
        blocks=[f"blocks.{b}" for b in range(blocks)], clean_score=torch.ones(2),
        corrupted_score=torch.zeros(2), targets=torch.zeros(2, dtype=torch.long), versus=None,
        scores=shares, layout=TokenLayout(prefix, grid, class_token=True), **shares,
    )  # fmt: skip


PATCHING_LAYOUTS = {  # each site set patching_maps draws, on small and ViT-B-sized models
    "all four panels": ({"sites": ("resid", "positions", "heads", "attn", "mlp")}),
    "all four, 12 blocks of 12 heads, 14x14": {
        "sites": ("resid", "positions", "heads", "attn", "mlp"), "blocks": 12, "heads": 12,
        "grid": (14, 14)},
    "registers, 12 blocks of 3 heads": {
        "sites": ("resid", "heads", "mlp"), "blocks": 12, "heads": 3, "prefix": 5},
    "positions and heads": {"sites": ("positions", "heads")},
    "positions": {"sites": ("positions",)},
    "heads and bars": {"sites": ("heads", "attn", "mlp")},
    "bars": {"sites": ("attn",)},
}  # fmt: skip

TEXT_BOXES = """
const groups = new Map(), texts = [];
for (const t of arguments[0].querySelectorAll('.main-svg text')) {
  const r = t.getBoundingClientRect(), tick = t.closest('g[class$="tick"]');
  if (!t.textContent.trim() || !r.width) continue;
  const layer = tick && tick.parentNode;  // one axis's ticks: plotly spaces them itself
  if (layer && !groups.has(layer)) groups.set(layer, groups.size);
  texts.push([t.textContent, layer ? groups.get(layer) : -1, r.left, r.top, r.right, r.bottom]);
}
const plots = [...arguments[0].querySelectorAll('.nsewdrag')].map(d => {
  const r = d.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; });
const f = arguments[0].querySelector('.main-svg').getBoundingClientRect();
return [texts, plots, [f.left, f.top, f.right, f.bottom]];
"""


def _layout_faults(texts, plots, frame) -> list[str]:
    """Text drawn past the figure's edge, over another text (but one axis's ticks) or over a
    plot area, in a browser's boxes (left, top, right, bottom)."""

    def overlap(a, b, slack=1.0):
        return (
            min(a[2], b[2]) - max(a[0], b[0]) > slack and min(a[3], b[3]) - max(a[1], b[1]) > slack
        )

    found = []
    for i, (text, group, *box) in enumerate(texts):
        if (
            box[0] < frame[0] - 1
            or box[2] > frame[2] + 1
            or box[1] < frame[1] - 1
            or box[3] > frame[3] + 1
        ):
            found.append(f"{text!r} cut off at the figure's edge")
        for other, other_group, *other_box in texts[i + 1 :]:
            if (group < 0 or group != other_group) and overlap(box, other_box):
                found.append(f"{text!r} over {other!r}")
        if group < 0 and any(overlap(box, plot) for plot in plots):
            found.append(f"{text!r} over a plot")
    return found


@pytest.mark.browser
@pytest.mark.parametrize("width", [900, 1400])
def test_patching_maps_keep_titles_labels_and_bars_clear_in_a_browser(width, tmp_path):
    """At 900 and 1400 px, with all four panels (resid, positions, heads, bars) and with fewer:
    no title, label, colour bar or legend text runs past the figure or over another text or a
    plot (the 900 px figure once cut its first subplot title off and ran it into the second)."""
    from lab import chromium

    page = tmp_path / "patching.html"
    figures = [vk.viz.patching_maps(_drawn_patching(**kw)) for kw in PATCHING_LAYOUTS.values()]
    page.write_text("<html><body>" + "".join(
        f.to_html(full_html=False, include_plotlyjs=i == 0) for i, f in enumerate(figures)
    ) + "</body></html>")  # fmt: skip
    with chromium(width, 1000) as browser:
        browser.get(page.as_uri())
        found = {}
        for name, plot in zip(
            PATCHING_LAYOUTS, browser.find_elements("css selector", ".js-plotly-plot"), strict=True
        ):
            browser.execute_script("arguments[0].scrollIntoView()", plot)
            problems = _layout_faults(*browser.execute_script(TEXT_BOXES, plot))
            if problems:
                found[name] = problems
        browser.save_screenshot(str(tmp_path / f"patching_{width}.png"))
    assert found == {}
