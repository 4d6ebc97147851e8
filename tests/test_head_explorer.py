"""HeadExplorer: its texts, maps and probability bars are the TextSpan results they show;
wrong inputs are refused; the model is left as it was."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import model_state

from vizkit.concepts import Heads, dissect, shapes_concepts, unit_names
from vizkit.datasets.captions import WordTokenizer
from vizkit.models.text_image import clip_shapes
from vizkit.targets import encode_texts
from vizkit.text import embedding_decomposition, text_span
from vizkit.widgets import HeadExplorer

POOL = ["a circle", "a red star", "a small ring", "a square at the top left", "a dark cross"]
CLASSES = ["circle", "star", "ring"]


@pytest.fixture(scope="module")
def explored():
    torch.manual_seed(0)
    tokenizer = WordTokenizer()
    model = clip_shapes(tokenizer.vocab_size, tokenizer.context_length, layers=2).eval()
    images = torch.randn(12, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    span = text_span(model, images, POOL, tokenizer=tokenizer, basis=3, progress=False)
    texts = encode_texts(model, [f"a {c}" for c in CLASSES], tokenizer)
    before = model_state(model)
    explorer = HeadExplorer(model, span, images, texts, CLASSES, top=4)
    return model, images, span, texts, explorer, before


def test_the_texts_and_top_images_are_the_span(explored):
    model, images, span, texts, explorer, before = explored
    explorer.block.value = span.blocks[0]
    explorer.head.value = 2
    labels = [label for label, _ in explorer.text.options]
    assert [label.rsplit(" (", 1)[0] for label in labels] == span.texts(0, 2)
    explorer.text.value = 1
    shown = span.top_images(0, 2, 1, 4).tolist()
    titles = [a.text for a in explorer.figure.layout.annotations]
    assert [f"image {i}" for i in shown] == [t for t in titles if t.startswith("image ")][:4]
    assert span.texts(0, 2)[1] in explorer.figure.layout.title.text.replace("<br>", " ")  # wrapped
    assert model_state(model) == before


def test_the_map_is_the_heads_token_shares(explored):
    model, images, span, _, explorer, _ = explored
    explorer.block.value, explorer.head.value, explorer.text.value = span.blocks[-1], 1, 0
    explorer.image.value = 5
    split = embedding_decomposition(model, images[[5]], tokens=-1)
    direction = F.normalize(span.text_embeddings[span.indices[-1, 1, 0]], dim=-1)
    shares = split.tokens[0, 0, 1, 1:] @ direction / split.embedding[0].norm()
    torch.testing.assert_close(explorer.token_map(5).flatten(), shares)
    heatmaps = [t for t in explorer.figure.data if t.type == "heatmap"]
    assert len(heatmaps) == 5  # four top images and the current one
    torch.testing.assert_close(torch.tensor(heatmaps[-1].z, dtype=torch.float32),
                               explorer.token_map(5))  # fmt: skip


def test_the_bars_mean_ablate_the_head(explored):
    model, _, span, texts, explorer, _ = explored
    explorer.block.value, explorer.head.value, explorer.image.value = span.blocks[0], 3, 7
    heads = span.decomposition.heads[:, 0, 3]
    embedding = span.decomposition.embedding[7]
    ablated = embedding - heads[7] + heads.mean(0)
    scale = float(model.logit_scale.detach().exp())
    want = (scale * F.normalize(ablated, dim=-1) @ F.normalize(texts, dim=-1).T).softmax(-1)
    bars = [t for t in explorer.figure.data if t.type == "bar"]
    assert [b.name for b in bars] == ["clean", "head mean-ablated"]
    got = dict(zip(bars[1].x, bars[1].y, strict=True))
    assert [got[c] for c in CLASSES] == pytest.approx(want.tolist(), abs=1e-6)


def test_images_other_than_the_spans_are_refused(explored):
    model, images, span, texts, _, _ = explored
    with pytest.raises(ValueError, match="span describes 12 images; got 11"):
        HeadExplorer(model, span, images[:11], texts, CLASSES)
    with pytest.raises(ValueError, match="2 class names for 3 class texts"):
        HeadExplorer(model, span, images, texts, CLASSES[:2])
    # issue 69: other images of the same count showed another image's top images
    with pytest.raises(ValueError, match=r"Images \[0, 6, 11\] are not the ones span was"):
        HeadExplorer(model, span, images.flip(0) + 0.5, texts, CLASSES)
    swapped = images.clone()
    swapped[[0, 11]] = images[[11, 0]]
    with pytest.raises(ValueError, match=r"Images \[0, 11\] are not the ones"):
        HeadExplorer(model, span, swapped, texts, CLASSES)


def test_heads_named_by_dissection_show_their_names(explored):
    """Names of the heads of both blocks (the span's blocks are the wrapper's, "model.<block>";
    the dissection's the model's own): each named head's option and the title carry its
    name; the options follow the block; names of another block's heads are refused."""
    model, images, span, texts, _, before = explored
    shapes, concepts = shapes_concepts(24)
    blocks = [block.removeprefix("model.") for block in span.blocks]
    named = [dissect(model, shapes, concepts, Heads(b), quantile=0.02, progress=False)
             for b in blocks]  # fmt: skip
    explorer = HeadExplorer(model, span, images, texts, CLASSES, top=4, names=named)
    for block, found in zip(span.blocks, named, strict=True):
        explorer.block.value = block
        labels = unit_names(found)
        options = dict((h, label) for label, h in explorer.head.options)
        for h in range(span.heads):
            expected = f"{h} {labels[h]}" if h in labels else str(h)
            assert options[h] == expected
        for h in labels:
            explorer.head.value = h
            assert f"head {h}<br>({found.labels[h]})" in explorer.figure.layout.title.text
    assert any(unit_names(found) for found in named)  # some head is a detector
    other = dissect(model, shapes, concepts, Heads(blocks[0]), progress=False)
    other.options["layer"] = "blocks.9.hook_attn_out"
    other.units = [u.replace(blocks[0], "blocks.9") for u in other.units]
    with pytest.raises(ValueError, match="does not show"):
        HeadExplorer(model, span, images, texts, CLASSES, names=[other])
    channels = dissect(model, shapes, concepts, f"{blocks[0]}.hook_resid_post", progress=False)
    with pytest.raises(ValueError, match="not of heads"):
        HeadExplorer(model, span, images, texts, CLASSES, names=channels)
    assert model_state(model) == before
