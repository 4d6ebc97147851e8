"""TextSpan (Gandelsman, Efros and Steinhardt 2024): the image embedding of every CLIP-family
model vizkit covers splits exactly into parts, heads and source tokens (checked against the
embedding, against heads split by editing, and against the heads computed by hand from
open_clip's weights), and the greedy text basis follows the reference algorithm's steps."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from conftest import model_state
from guide_example import run_first_example

from vizkit.datasets.captions import WordTokenizer
from vizkit.models import zero_shot_predictions
from vizkit.models.text_image import clip_shapes
from vizkit.text import (
    decompose_images,
    embedding_decomposition,
    fit_text_map,
    label_shares,
    mean_ablated,
    mean_ablation,
    span_texts,
    text_maps,
    text_span,
)

transformers = pytest.importorskip("transformers")
open_clip = pytest.importorskip("open_clip")

_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 2, "image_size": 32, "patch_size": 8}  # fmt: skip
_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
         "num_attention_heads": 2}  # fmt: skip


def _open_clip() -> torch.nn.Module:
    torch.manual_seed(0)
    return open_clip.model.CLIP(
        embed_dim=16,
        vision_cfg={"image_size": 32, "patch_size": 8, "width": 32, "layers": 2, "head_width": 16},
        text_cfg={"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1},
    ).eval()  # fmt: skip


def _hf_clip() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.CLIPConfig(vision_config=_VISION, text_config=_TEXT, projection_dim=16)
    return transformers.CLIPModel(config).eval()


def _hf_projected() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.CLIPVisionConfig(**_VISION, projection_dim=16)
    return transformers.CLIPVisionModelWithProjection(config).eval()


def _ours() -> torch.nn.Module:
    torch.manual_seed(0)
    tokenizer = WordTokenizer()
    return clip_shapes(tokenizer.vocab_size, tokenizer.context_length, layers=2).eval()


MODELS = {"open_clip": _open_clip, "hf_clip": _hf_clip, "hf_projected": _hf_projected,
          "clip_shapes": _ours}  # fmt: skip


def _embed(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if hasattr(model, "encode_image"):
            return model.encode_image(x)
        if hasattr(model, "get_image_features"):
            out = model.get_image_features(pixel_values=x)
            return getattr(out, "pooler_output", out)
        return model(pixel_values=x).image_embeds


@pytest.mark.parametrize("name", MODELS)
def test_parts_heads_and_tokens_sum_to_the_embedding(name):
    model = MODELS[name]()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    before = model_state(model)
    result = embedding_decomposition(model, x, tokens=-1)
    assert model_state(model) == before
    embedding = _embed(model, x)
    scale = float(embedding.abs().max())
    assert torch.allclose(result.embedding, embedding, atol=1e-5 * scale)
    total = result.contributions.sum(1) + result.constant
    assert torch.allclose(total, embedding, atol=1e-4 * scale)
    assert torch.allclose(result.tokens.sum(3), result.heads[:, -1:], atol=1e-5 * scale)
    tokens = 1 + result.layout.num_patches
    assert result.tokens.shape == (3, 1, result.heads.shape[2], tokens, embedding.shape[-1])
    assert result.token_blocks == result.blocks[-1:]


def test_heads_and_tokens_equal_a_hand_computation_on_open_clip():
    """open_clip's heads cannot be split by editing (torch's attention returns its map beside
    the output), so they are checked here against W_O^h v_j a_0j through the frozen ln_post
    and proj, written out from the weights."""
    model = _open_clip()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    result = embedding_decomposition(model, x, tokens=[0, 1], check_heads=True)
    assert "no edited split" in result.notes["heads"]
    visual = model.visual
    streams = {}
    hooks = [visual.ln_post.register_forward_hook(
        lambda m, a, o: streams.__setitem__("final", a[0]))]  # fmt: skip
    for i, block in enumerate(visual.transformer.resblocks):
        hooks.append(block.ln_1.register_forward_hook(
            lambda m, a, o, i=i: streams.__setitem__(i, o)))  # fmt: skip
    with torch.no_grad():
        model.encode_image(x)
    for h in hooks:
        h.remove()
    final = streams["final"][:, 0]  # (B, C): the class token entering ln_post
    sigma = (final.var(-1, unbiased=False, keepdim=True) + visual.ln_post.eps).sqrt()
    for i, block in enumerate(visual.transformer.resblocks):
        with torch.no_grad():
            expected = _by_hand(block.attn, streams[i], visual, sigma)
        scale = 1e-5 * float(expected.abs().max())
        assert torch.allclose(result.tokens[:, i], expected, atol=scale)  # (B, H, N, D)
        assert torch.allclose(result.heads[:, i], expected.sum(2), atol=scale)


def _by_hand(attn, y, visual, sigma):
    """(B, H, N, D) each head through each source token into the class token, then the frozen
    ln_post and proj, from torch attention ``attn``'s weights and its input ``y`` (B, N, C)."""
    heads = attn.num_heads
    w_q, w_k, w_v = attn.in_proj_weight.chunk(3)
    b_q, b_k, b_v = attn.in_proj_bias.chunk(3)
    q, k, v = ((y @ w.T + b).unflatten(-1, (heads, -1)).transpose(1, 2)
               for w, b in ((w_q, b_q), (w_k, b_k), (w_v, b_v)))  # fmt: skip
    a = ((q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5).softmax(-1)  # (B, H, N, N)
    w_o = attn.out_proj.weight.T.unflatten(0, (heads, -1))  # (H, d, C)
    written = a[:, :, 0, :, None] * torch.einsum("bhnd,hdc->bhnc", v, w_o)  # (B, H, N, C)
    centred = written - written.mean(-1, keepdim=True)
    return (centred * visual.ln_post.weight / sigma[:, None, None]) @ visual.proj


def test_transformers_heads_are_checked_against_the_edited_split():
    result = embedding_decomposition(_hf_clip(), torch.randn(2, 3, 32, 32), check_heads=True)
    assert "heads" not in result.notes and result.heads.shape == (2, 2, 2, 16)


def _siglip() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.SiglipConfig(vision_config=_VISION, text_config=_TEXT)
    return transformers.SiglipModel(config).eval()


def _layer_scaled() -> torch.nn.Module:
    """open_clip with LayerScale: the attention output is gamma * (W_O z + b_O), which the
    values and W_O alone do not give."""
    torch.manual_seed(0)
    return open_clip.model.CLIP(
        embed_dim=16,
        vision_cfg={"image_size": 32, "patch_size": 8, "width": 32, "layers": 2,
                    "head_width": 16, "ls_init_value": 0.5},
        text_cfg={"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1},
    ).eval()  # fmt: skip


def _graph_oracle(model, x, keep, embedding):
    """The parts' contributions, heads and kept blocks' tokens by the path that reads each head
    through the recorded graph from its map (a backward per embedding dimension)."""
    from vizkit.analysis.residual_stream import StreamReadout, residual_blocks, stream_parts
    from vizkit.hooks import HookedModel
    from vizkit.models import image_tower
    from vizkit.text.attention_graph import graph_split
    from vizkit.text.pooling import PoolingReadout, pooling_head

    if hasattr(model, "encode_image") or hasattr(model, "get_image_features"):
        model = image_tower(model)
    hm = HookedModel(model)
    blocks = residual_blocks(hm)
    parts = stream_parts(hm, x)[0]
    if pooling_head(model) is None:
        readout = StreamReadout(hm, x, blocks)
    else:
        readout = PoolingReadout(hm, x, blocks, embedding)
        parts = torch.cat([parts, torch.zeros_like(parts[:1])])
    dims = embedding.shape[-1]
    contributions, by_token = graph_split(hm, x, blocks, readout, parts, dims, True, 2**28)
    return contributions, by_token.sum(3), by_token[:, keep]


@pytest.mark.parametrize("name", [*MODELS, "siglip", "layer_scaled"])
def test_heads_read_in_the_forward_equal_the_graph_oracle(name):
    """The heads and tokens read off each block's map and values in the one forward equal the
    graph path's, which differentiates each attention output with respect to its map; a
    model whose blocks the values do not explain (LayerScale) is read through the graph, and
    says so."""
    model = {**MODELS, "siglip": _siglip, "layer_scaled": _layer_scaled}[name]()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(11))
    result = embedding_decomposition(model, x, tokens=[0, -1])
    if name == "layer_scaled":
        assert "read through its graph" in result.notes["speed"]
    else:
        assert "speed" not in result.notes, result.notes
    contributions, heads, tokens = _graph_oracle(model, x, [0, 1], result.embedding)
    if name == "siglip":
        contributions = contributions[:, :-1]  # the head MLP's term is set apart by both
        result_parts = result.contributions[:, :-1]
    else:
        result_parts = result.contributions
    for ours, oracle in ((result_parts, contributions), (result.heads, heads),
                         (result.tokens, tokens)):  # fmt: skip
        assert ours.shape == oracle.shape
        scale = float(oracle.abs().max())
        assert scale > 0 and torch.allclose(ours, oracle, atol=1e-5 * scale)


def _held_runs(monkeypatch) -> list:
    """The clean runs the decomposition makes from now on, as it holds them."""
    decomposition = importlib.import_module("vizkit.text.decomposition")
    clean_run, held = decomposition._clean_run, []

    def holding(*args):
        held.append(clean_run(*args))
        return held[-1]

    monkeypatch.setattr(decomposition, "_clean_run", holding)
    return held


def _assert_equal_results(ours, full) -> None:
    for name in ("contributions", "constant", "embedding", "heads", "tokens"):
        value, expected = getattr(ours, name), getattr(full, name)
        assert value.shape == expected.shape, name
        scale = float(expected.abs().max())
        assert torch.allclose(value, expected, rtol=0, atol=1e-5 * scale), name


@pytest.mark.parametrize("name", ["open_clip", "hf_clip", "clip_shapes"])
def test_a_class_token_head_keeps_only_the_rows_it_reads(name, monkeypatch):
    """A head that reads the class token alone needs each part's and each map's first row
    only (and every token's values): one forward that keeps just those, equal to the
    decomposition that keeps every row."""
    decomposition = importlib.import_module("vizkit.text.decomposition")
    held = _held_runs(monkeypatch)
    model = MODELS[name]()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(12))
    cut = embedding_decomposition(model, x, tokens=[0, -1])
    (run,) = held
    tokens = 1 + cut.layout.num_patches
    assert run.stream.parts.shape[1:3] == (3, 1)
    assert {m.shape[2:] for m in run.maps.values()} == {(1, tokens)}
    assert {v.values.shape[1] for v in run.values.values()} == {tokens}
    assert run.stream.final.shape[1] == tokens
    monkeypatch.setattr(decomposition, "rows_hint", lambda *args: None)
    full = embedding_decomposition(model, x, tokens=[0, -1])
    assert held[1].stream.parts.shape[2] == tokens
    assert {m.shape[2:] for m in held[1].maps.values()} == {(tokens, tokens)}
    _assert_equal_results(cut, full)


def test_a_wrong_rows_hint_reads_every_row_again(monkeypatch):
    """SigLIP's pooling head reads every token: told it reads the first one, the
    decomposition finds the head reads more and runs again keeping every row."""
    decomposition = importlib.import_module("vizkit.text.decomposition")
    model = _siglip()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(13))
    full = embedding_decomposition(model, x, tokens=-1)
    held = _held_runs(monkeypatch)
    monkeypatch.setattr(decomposition, "rows_hint", lambda *args: 1)
    again = embedding_decomposition(model, x, tokens=-1)
    assert [run.stream.parts.shape[2] for run in held] == [1, 16]
    _assert_equal_results(again, full)


def test_cosine_shares_sum_to_the_cosine():
    model = _ours()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    result = embedding_decomposition(model, x, tokens=[0, 1])
    texts = torch.randn(5, 64)
    cosine = F.normalize(result.embedding, dim=-1) @ F.normalize(texts, dim=-1).T
    norms = result.embedding.norm(dim=-1)[:, None]
    constant = result.constant @ F.normalize(texts, dim=-1).T / norms
    assert torch.allclose(result.cosine(texts).sum(1) + constant, cosine, atol=1e-5)
    tokens = result.token_cosine(texts)  # (B, K, N) through every head of both blocks
    attn = [i for i, p in enumerate(result.parts) if p.endswith(" attn")]
    heads = result.cosine(texts)[:, attn].sum(1) - (
        (result.contributions[:, attn].sum(1) - result.heads.sum((1, 2)))
        @ F.normalize(texts, dim=-1).T
        / result.embedding.norm(dim=-1)[:, None]
    )
    assert torch.allclose(tokens.sum(-1), heads, atol=1e-5)
    with pytest.raises(ValueError, match="were not split by token"):
        embedding_decomposition(model, x, tokens=-1).token_cosine(texts, ["nope"])


def test_siglips_pooling_head_is_read_with_its_map_frozen():
    """SigLIP's attention-pooling head is affine in the stream once its map and the final
    norm's scale are frozen; its MLP's term is the part "head mlp"."""
    config = transformers.SiglipConfig(vision_config=_VISION, text_config=_TEXT)
    torch.manual_seed(0)
    model = transformers.SiglipModel(config).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(8))
    result = embedding_decomposition(model, x, tokens=-1, check_heads=True)
    embedding = model.get_image_features(pixel_values=x)
    embedding = getattr(embedding, "pooler_output", embedding).detach()
    scale = 1e-4 * float(embedding.abs().max())
    assert result.parts[-1] == "head mlp"
    assert torch.allclose(result.contributions.sum(1) + result.constant, embedding, atol=scale)
    with torch.no_grad():  # the head MLP's term, by hand
        vision = model.vision_model
        z = vision.head.attention(
            vision.head.probe.repeat(2, 1, 1),
            *[vision.post_layernorm(vision(x).last_hidden_state)] * 2,
        )[0]
    assert torch.allclose(result.contributions[:, -1], (embedding - z[:, 0]), atol=scale)
    assert "heads" not in result.notes  # checked against the edited split
    assert result.tokens.shape == (2, 1, 2, 16, 32)  # no class token: 16 patches


def test_tokens_need_heads_and_a_known_block():
    model = _ours()
    with pytest.raises(ValueError, match="needs heads=True"):
        embedding_decomposition(model, torch.randn(1, 3, 32, 32), heads=False, tokens=-1)
    with pytest.raises(ValueError, match="tokens: index 5 does not exist"):
        embedding_decomposition(model, torch.randn(1, 3, 32, 32), tokens=5)


def _reference_span(data: np.ndarray, texts: np.ndarray, iters: int, rank: int):
    """TextSpan's ``replace_with_iterative_removal`` (clip_text_span, compute_complete_text_set
    .py) written out step by step in numpy: texts onto the span of the data's top ``rank``
    right singular vectors, data centred, then per step the text of largest projection std,
    removed from the data and from every text."""
    _, _, vh = np.linalg.svd(data, full_matrices=False)
    vh = vh[:rank]
    texts = (vh.T @ np.linalg.inv(vh @ vh.T) @ vh @ texts.T).T
    mean = data.mean(0, keepdims=True)
    data = data - mean
    reconstruct = np.repeat(mean, len(data), 0)
    chosen = []
    for _ in range(iters):
        top = int(np.argmax((data @ texts.T).std(0)))
        chosen.append(top)
        norm = texts[top] @ texts[top]
        along = (data @ texts[top] / norm)[:, None] * texts[top][None]
        reconstruct = reconstruct + along
        data = data - along
        texts = texts - (texts @ texts[top] / norm)[:, None] * texts[top][None]
    return chosen, reconstruct


@pytest.mark.parametrize("rank", [3, 8])
def test_the_greedy_basis_follows_the_reference_steps(rank):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(200, 12)) @ rng.normal(size=(12, 12))
    texts = rng.normal(size=(30, 12))
    texts /= np.linalg.norm(texts, axis=1, keepdims=True)
    chosen, reconstruct = _reference_span(data, texts, min(rank, 5), rank)
    found = span_texts(torch.tensor(data), torch.tensor(texts), basis=5, rank=rank)
    assert found.indices == chosen  # at rank 3 the texts left after three are zero: it stops
    assert np.allclose(found.reconstruction.numpy(), reconstruct, atol=1e-4)
    assert all(b > a for a, b in zip(found.explained, found.explained[1:], strict=False))


def test_the_basis_finds_planted_texts():
    """Data written along three of forty text directions (plus a little noise): those three
    are the basis, and they explain nearly all the variance."""
    generator = torch.Generator().manual_seed(0)
    texts = F.normalize(torch.randn(40, 16, generator=generator), dim=-1)
    weights = torch.randn(500, 3, generator=generator) * torch.tensor([3.0, 2.0, 1.0])
    data = weights @ texts[[7, 19, 31]] + 0.01 * torch.randn(500, 16, generator=generator)
    found = span_texts(data, texts, basis=3)
    assert sorted(found.indices) == [7, 19, 31] and found.explained[-1] > 0.999


def test_text_span_describes_every_head_and_ranks_its_images():
    model = _ours()
    tokenizer = WordTokenizer()
    x = torch.randn(24, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    pool = ["a circle", "a red star", "a small ring", "a square at the top left", "a dark cross"]
    decomposition = decompose_images(model, x, batch_size=10, progress=False)
    assert decomposition.heads.shape == (24, 2, 4, 64) and "speed" not in decomposition.notes
    span = text_span(model, decomposition, pool, tokenizer=tokenizer, basis=2)
    rows = span.table()
    assert len(rows) == 8 and all(len(r["texts"]) == 2 and set(r["texts"]) <= set(pool)
                                  for r in rows)  # fmt: skip
    assert all(0 < r["explained"] <= 1 for r in rows)
    top = span.top_images(-1, 0, text=1, count=5)
    direction = F.normalize(span.text_embeddings[span.indices[-1, 0, 1]], dim=-1)
    shares = decomposition.heads[:, -1, 0] @ direction / decomposition.embedding.norm(dim=-1)
    assert top.tolist() == shares.argsort(descending=True)[:5].tolist()
    again = text_span(model, x, pool, tokenizer=tokenizer, basis=2, layers=-1, progress=False)
    assert again.blocks == span.blocks[-1:]
    assert torch.equal(again.indices, span.indices[-1:])


def _decomposed(images: int = 12):
    model = _ours()
    x = torch.randn(images, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    return model, decompose_images(model, x, batch_size=5, tokens=[-2, -1], progress=False)


def test_images_are_decomposed_in_batches_their_bytes_allow(monkeypatch):
    """decompose_images decomposes the first image alone, then as many images per batch as
    the byte budget holds by what that one held (at most batch_size), equal to one batch."""
    from vizkit.text.decomposition import image_bytes

    span_module = importlib.import_module("vizkit.text.span")
    model = _ours()
    x = torch.randn(12, 3, 32, 32, generator=torch.Generator().manual_seed(14))
    whole = embedding_decomposition(model, x, tokens=-1)
    per_image = image_bytes(embedding_decomposition(model, x[:1], tokens=-1))
    assert per_image > 0
    sizes = []

    def counted(model, images, **kwargs):
        sizes.append(len(images))
        return embedding_decomposition(model, images, **kwargs)

    monkeypatch.setattr(span_module, "embedding_decomposition", counted)
    for budget, limit, expected in ((3 * per_image + 1, 64, [1, 3, 3, 3, 2]),
                                    (per_image - 1, 64, [1] * 12),
                                    (2**40, 4, [1, 4, 4, 3])):  # fmt: skip
        sizes.clear()
        batched = decompose_images(model, x, batch_size=limit, tokens=-1, progress=False,
                                   max_bytes=budget)  # fmt: skip
        assert sizes == expected
        _assert_equal_results(batched, whole)


def test_the_bytes_held_follow_the_rows_kept():
    """A class token's rows for CLIP, every row for SigLIP: at ViT-B/16's shape about 45 MB an
    image with every row, under a third of that with the class token's."""
    from vizkit.text.decomposition import image_bytes

    clip = embedding_decomposition(_hf_clip(), torch.randn(1, 3, 32, 32), tokens=-1)
    assert clip.options["rows"] == 1 and clip.options["sequence"] == 17
    siglip = embedding_decomposition(_siglip(), torch.randn(1, 3, 32, 32), tokens=-1)
    assert siglip.options["rows"] == siglip.options["sequence"] == 16
    big = dataclasses.replace(clip, blocks=["b"] * 12, heads=torch.zeros(1, 12, 12, 512),
                              token_blocks=[], embedding=torch.zeros(1, 512),
                              options={"width": 768, "sequence": 197, "rows": 197})  # fmt: skip
    full = image_bytes(big)
    assert 40e6 < full < 55e6
    assert image_bytes(dataclasses.replace(big, options={**big.options, "rows": 1})) < full / 3


def test_mean_ablation_replaces_parts_by_their_mean():
    _, decomposition = _decomposed()
    parts = decomposition.parts
    assert torch.allclose(mean_ablated(decomposition, parts), decomposition.embedding, atol=1e-5)
    none = mean_ablated(decomposition, [])
    assert torch.allclose(none, decomposition.embedding.mean(0).expand_as(none), atol=1e-5)
    kept = parts[-2:]
    by_hand = (decomposition.contributions[:, -2:].sum(1) + decomposition.constant
               + decomposition.contributions[:, :-2].mean(0).sum(0))  # fmt: skip
    assert torch.allclose(mean_ablated(decomposition, kept), by_hand, atol=1e-5)
    with pytest.raises(ValueError, match="are not parts"):
        mean_ablated(decomposition, ["blocks.0 attn"])
    texts = torch.randn(3, 64, generator=torch.Generator().manual_seed(6))
    labels = zero_shot_predictions(decomposition.embedding, texts)
    labels[:4] = (labels[:4] + 1) % 3  # a third of the labels wrong
    table = mean_ablation(decomposition, texts, labels)
    assert table.names[:2] == ["nothing", "the embedding and every MLP"]
    assert float(table.accuracy[0]) == pytest.approx(8 / 12)
    assert sorted(table.ablated[-1]) == sorted(p for p in parts if p != parts[-2])  # last attn kept
    with pytest.raises(ValueError, match="one class per decomposed image"):
        mean_ablation(decomposition, texts, labels[:5])


def test_label_shares_are_the_correlation_ratio():
    _, decomposition = _decomposed()
    labels = ["a", "b", "c"] * 4
    shares = label_shares(decomposition, {"letters": labels, "same": ["x"] * 12})
    data = decomposition.heads / decomposition.embedding.norm(dim=-1)[:, None, None, None]
    data = data[:, 1, 2].double().numpy()  # block 1, head 2: (n, D)
    centred = data - data.mean(0)
    groups = np.array(labels)
    between = sum((groups == g).sum() * np.sum(centred[groups == g].mean(0) ** 2) for g in "abc")
    assert float(shares.shares[1, 2, 0]) == pytest.approx(between / np.sum(centred**2), rel=1e-4)
    assert float(shares.shares[..., 1].max()) < 1e-6  # one group explains nothing
    assert shares.strongest("letters", 1)[0][2] == pytest.approx(float(shares.shares[..., 0].max()))
    with pytest.raises(ValueError, match="has 3 labels for 12 images"):
        label_shares(decomposition, {"short": ["a", "b", "c"]})


def test_text_maps_are_the_patches_shares_of_the_cosine():
    _, decomposition = _decomposed(4)
    texts = torch.randn(3, 64, generator=torch.Generator().manual_seed(7))
    maps = text_maps(decomposition, texts, torch.tensor([0, 1, 2, 0]))
    assert maps.maps.shape == (4, 8, 8) and maps.method == "text_span_tokens"
    shares = decomposition.token_cosine(texts)  # (B, K, N)
    assert torch.allclose(maps.maps[1].flatten(), shares[1, 1, 1:])
    specific = text_maps(decomposition, texts, 2, versus_mean=True)
    assert torch.allclose(specific.maps[0].flatten(), (shares[0, 2] - shares[0].mean(0))[1:])
    last = text_maps(decomposition, texts, 0, blocks=decomposition.token_blocks[-1:])
    assert not torch.allclose(last.maps, maps.maps[[0]].expand(4, -1, -1))
    for wrong in (3, -1, [0, 1, 2], torch.tensor([0, 1, 2, 3])):
        with pytest.raises(ValueError, match="targets must be an int or 4 ints"):
            text_maps(decomposition, texts, wrong)
    for rounded in (1.5, float("nan"), torch.zeros(4), True):  # never rounded to an index
        with pytest.raises(TypeError, match="an index is never rounded"):
            text_maps(decomposition, texts, rounded)
    torch.testing.assert_close(text_maps(decomposition, texts, np.int64(2)).maps,
                               text_maps(decomposition, texts, [2, 2, 2, 2]).maps)  # fmt: skip


def test_the_guide_example_prints_what_the_guide_says():
    printed, said = run_first_example("text-span.md")
    assert printed == said


def test_a_backbone_is_read_through_a_fitted_linear_map():
    """The map is scikit-learn's ridge regression (with an intercept, alpha = ridge x the
    mean variance of the backbone's dimensions x images) from the backbone's embeddings to the
    text-image model's unit embeddings; the backbone's decomposition carried through it sums
    to the mapped embedding, and TextSpan runs on it with the text model's texts."""
    timm = pytest.importorskip("timm")
    linear_model = pytest.importorskip("sklearn.linear_model")
    torch.manual_seed(0)
    backbone = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32,
                                 depth=2, num_heads=2, num_classes=0).eval()  # fmt: skip
    clip = _ours()
    x = torch.randn(80, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    fitted = fit_text_map(backbone, clip, x, ridge=0.1, held_out=0.25)
    with torch.no_grad():
        features = backbone(x[:60]).double().numpy()
        target = F.normalize(clip.encode_image(x[:60]), dim=-1).double().numpy()
    centred = features - features.mean(0)
    alpha = 0.1 * np.trace(centred.T @ centred) / features.shape[1]
    oracle = linear_model.Ridge(alpha=alpha).fit(features, target)
    assert np.allclose(fitted.weight.numpy(), oracle.coef_, atol=1e-4)
    assert np.allclose(fitted.bias.numpy(), oracle.intercept_, atol=1e-4)
    assert fitted.scores["images"] == 20 and fitted.scores["fit_images"] == 60
    assert fitted.scores["fit_r2"] > fitted.scores["r2"]  # fitted on, scored on
    split = embedding_decomposition(backbone, x[:6], tokens=-1)
    mapped = fitted.decomposition(split)
    assert torch.allclose(mapped.contributions.sum(1) + mapped.constant, mapped.embedding,
                          atol=1e-4)  # fmt: skip
    assert torch.allclose(mapped.heads, split.heads @ fitted.weight.T, atol=1e-6)
    assert mapped.tokens.shape[-1] == 64 and "text_map" in mapped.notes
    span = text_span(clip, mapped, ["a circle", "a red star", "a dark ring"], WordTokenizer(),
                     basis=2)  # fmt: skip
    assert len(span.table()) == 4
    with pytest.raises(ValueError, match="takes 32-wide embeddings"):
        fitted(torch.zeros(2, 64))


def test_dinov2_is_decomposed_and_read_through_the_map():
    """A self-supervised backbone without a text tower (transformers' Dinov2Model, its pooled
    output the normed class token): its decomposition sums to its embedding and carries through
    a map fitted into the text-image model's space."""
    config = transformers.Dinov2Config(**_VISION)
    torch.manual_seed(0)
    backbone = transformers.Dinov2Model(config).eval()
    x = torch.randn(40, 3, 32, 32, generator=torch.Generator().manual_seed(10))
    split = embedding_decomposition(backbone, x[:4], tokens=-1)
    with torch.no_grad():
        pooled = backbone(pixel_values=x[:4]).pooler_output
    assert torch.allclose(split.contributions.sum(1) + split.constant, pooled, atol=1e-4)
    assert "heads" not in split.notes  # checked against the edited split
    fitted = fit_text_map(backbone, _ours(), x)
    mapped = fitted.decomposition(split)
    assert torch.allclose(mapped.embedding, fitted(pooled), atol=1e-5)
    assert torch.allclose(mapped.contributions.sum(1) + mapped.constant, mapped.embedding,
                          atol=1e-4)  # fmt: skip


def test_text_span_refuses_bad_arguments_before_any_image_is_decomposed(monkeypatch):
    """Issue 69: refusals came after every image was decomposed, and one image gave texts
    explaining 100 % of a variance of 0."""
    span_module = importlib.import_module("vizkit.text.span")
    monkeypatch.setattr(span_module, "decompose_images", lambda *a, **k: pytest.fail("ran"))
    model, tokenizer = _ours(), WordTokenizer()
    x = torch.randn(4, 3, 32, 32)
    with pytest.raises(ValueError, match="at least two images"):
        text_span(model, x[:1], ["a circle", "a star"], tokenizer=tokenizer, basis=2)
    for pool in ([], ["a circle"], ["a circle", " "]):
        with pytest.raises(ValueError, match="descriptions must be at least two non-empty"):
            text_span(model, x, pool, tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"basis must be an int in \[1, 2\]"):
        text_span(model, x, ["a circle", "a star"], tokenizer=tokenizer, basis=3)
    backbone = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1,
                                 num_classes=0).eval()  # fmt: skip
    with pytest.raises((TypeError, ValueError), match="text"):
        text_span(backbone, x, ["a circle", "a star"], tokenizer=tokenizer, basis=2)
