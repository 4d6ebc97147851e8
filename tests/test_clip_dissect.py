"""CLIP-Dissect (`vizkit.concepts.clip_dissect`): the similarity functions against a hand
computation, planted units named after their concepts, the shipped Shapes ViT named by the
zoo's CLIP model, refusals, the model left as it was, and the result's round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import patch_mean_vit
from torch.utils.data import DataLoader, TensorDataset

import vizkit as vk
from vizkit.analysis.result import Result
from vizkit.concepts import CLIPDissection, clip_dissect
from vizkit.concepts.clip_dissect import (
    SIMILARITIES,
    cos_similarity,
    cubed_cos_similarity,
    soft_wpmi,
)
from vizkit.datasets.captions import WordTokenizer

SIZE, PATCH = 16, 4  # a 4 x 4 patch grid
STREAM = "blocks.0.hook_resid_pre"  # the patch embedding: what the planted units are made of
PLANTED = ["red", "green", "blue"]  # image channel c marks concept c
TEXTS = [*PLANTED, "anything"]  # "anything": as similar to every image


def _planted_vit() -> torch.nn.Module:
    """Channels 0-2 of the patch embedding: the means of image channels 0-2 over the patch."""
    return patch_mean_vit(SIZE, PATCH, means=3)


def _planted_probe(per_concept: int = 10) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images of concept c: image channel c is 1, the others 0 (so planted unit c's mean
    activation is the indicator of concept c); their (N, 4) similarities with `TEXTS`: about 0.3
    with their own concept, 0.1 with the others, 0.25 with "anything"; and each image's
    concept."""
    generator = torch.Generator().manual_seed(2)
    concept = torch.arange(3).repeat_interleave(per_concept)
    images = F.one_hot(concept, 3).float()[:, :, None, None].expand(-1, -1, SIZE, SIZE)
    image_text = torch.full((len(concept), len(TEXTS)), 0.1)
    image_text[torch.arange(len(concept)), concept] = 0.3
    image_text[:, 3] = 0.25
    image_text += 0.01 * torch.randn(image_text.shape, generator=generator)
    return images.contiguous(), image_text, concept


def _hooks_and_grads(model: torch.nn.Module) -> bool:
    """Whether any module holds a hook or any parameter a gradient."""
    hooked = any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                 for m in model.modules())  # fmt: skip
    return hooked or any(p.grad is not None for p in model.parameters())


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_similarities_equal_a_hand_computation():
    rng = np.random.default_rng(0)
    q, p = rng.normal(size=(40, 6)), rng.uniform(0.1, 0.4, size=(40, 7))
    top, temperature = 8, 0.1
    unit = lambda a: a / np.linalg.norm(a, axis=0)  # noqa: E731
    cos = unit(q).T @ unit(p)
    cubed = unit((q - q.mean(0)) ** 3).T @ unit((p - p.mean(0)) ** 3)  # the reference's
    given = _softmax(p / temperature)  # p(t_m|x)
    in_top = 0.998 - np.arange(top) / top * (0.998 - 0.97)  # p(x in B_k), P_START to P_END
    log_given = np.stack([
        np.log(1 + in_top[:, None] * (given[np.argsort(-q[:, k])[:top]] - 1) + 1e-7).sum(0)
        for k in range(q.shape[1])
    ])  # log p(t_m|B_k), MIN_PROB 1e-7  # fmt: skip
    log_prior = np.log(np.exp(log_given).mean(0))  # log p(t_m): the mean over the units
    wpmi = log_given - 1.0 * log_prior  # LAMBDA 1
    qt, pt = torch.tensor(q, dtype=torch.float32), torch.tensor(p, dtype=torch.float32)
    np.testing.assert_allclose(cos_similarity(qt, pt).numpy(), cos, atol=1e-5)
    np.testing.assert_allclose(cubed_cos_similarity(qt, pt).numpy(), cubed, atol=1e-5)
    np.testing.assert_allclose(soft_wpmi(qt, pt, top, temperature).numpy(), wpmi, atol=1e-4)


def test_planted_units_are_named_after_their_concepts_by_every_similarity():
    model = _planted_vit()
    images, image_text, _ = _planted_probe()
    results = {}
    for similarity in SIMILARITIES:
        result = clip_dissect(model, images, TEXTS, STREAM, image_text=image_text,
                              similarity=similarity, batch_size=7, progress=False)  # fmt: skip
        assert result.units[:3] == [f"{STREAM} {c}" for c in range(3)], similarity
        assert result.labels[:3] == PLANTED, (similarity, result.similarity[:3])
        assert result.similarity.shape == (16, len(TEXTS)) and result.best.shape == (16,)
        assert result.options["top"] == 5 and result.options["similarity"] == similarity
        results[similarity] = result
    loader = DataLoader(TensorDataset(images), batch_size=4)
    again = clip_dissect(model, loader, TEXTS, STREAM, image_text=image_text, progress=False)
    torch.testing.assert_close(again.similarity, results["soft_wpmi"].similarity)


def test_shapes_vit_units_named_by_the_zoo_clip_model():
    """The shipped Shapes ViT's last block (128 channels) on 200 Shapes test images, named by
    ``clip_shapes`` among "a circle", "a square", ... (its zero-shot accuracy there: 0.86). Of
    the 10 units that tell a class from the others best (highest AUC of their mean activation),
    soft-WPMI names 7 after that class (cos^3 6, cos 2; chance 1)."""
    model, card = vk.zoo.load("vit_tiny_shapes")
    clip, clip_card = vk.zoo.load("clip_shapes")
    clip.train()
    tokenizer = WordTokenizer.from_dict(clip_card["tokenizer"])
    shapes = vk.datasets.Shapes("test", n=200)
    images = torch.stack([shapes[i][0] for i in range(len(shapes))])
    texts = [f"a {c}" for c in card["classes"]]
    name = "blocks.3.hook_resid_post"
    result = clip_dissect(model, images, texts, name, clip, tokenizer, progress=False)
    assert clip.training and not _hooks_and_grads(clip)
    clip.eval()
    with torch.no_grad():
        _, cache = vk.hooks.HookedModel(model).run_with_cache(images, [name])
    q = cache[name][:, 1:].mean(1)  # (N, 128): each channel's mean over the patches
    image = F.normalize(vk.targets.embed(vk.models.image_tower(clip), images), dim=-1)
    p = image @ vk.targets.encode_texts(clip, texts, tokenizer).T  # (N, 10)
    expected = soft_wpmi(q, p, top=10, temperature=0.1).float()
    torch.testing.assert_close(result.similarity, expected, rtol=1e-4, atol=1e-3)
    classes = torch.arange(len(texts))
    best_units = _auc(q, shapes.labels[:, None] == classes).argmax(0)  # (10,) per class
    named = torch.tensor([texts.index(label) for label in result.labels])
    assert (named[best_units] == classes).sum() >= 3, [result.labels[u] for u in best_units]


def _auc(scores: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """(U, K) the AUC of each column of ``scores`` (N, U) for each column of ``positive``
    (N, K) bool (the Mann-Whitney statistic; no ties in float activations)."""
    ranks = scores.argsort(0).argsort(0).double() + 1  # (N, U)
    hits = positive.double()
    n1 = hits.sum(0)
    return (ranks.T @ hits - n1 * (n1 + 1) / 2) / (n1 * (len(hits) - n1))


def test_the_clip_model_may_be_the_dissected_model():
    clip, card = vk.zoo.load("clip_shapes")
    tokenizer = WordTokenizer.from_dict(card["tokenizer"])
    images = vk.datasets.load_sample()[0][:24]
    texts = [f"a {c}" for c in card["classes"]]
    result = clip_dissect(clip, images, texts, "visual.transformer.resblocks.3.hook_resid_post",
                          clip, tokenizer, similarity="cos", progress=False)  # fmt: skip
    assert result.similarity.shape == (len(result.units), 10) and len(result.units) > 0
    assert set(result.labels) <= set(texts) and not _hooks_and_grads(clip)


def test_units_read_from_a_store_are_named_as_from_the_model(tmp_path):
    model = _planted_vit()
    images, image_text, _ = _planted_probe()
    store = vk.cache_activations(model, images, tmp_path / "s", layers=[STREAM],
                                 tokens="patches", progress=False)  # fmt: skip
    ran = clip_dissect(model, images, TEXTS, STREAM, image_text=image_text, progress=False)
    read = clip_dissect(model, None, TEXTS, STREAM, image_text=image_text, batch_size=7,
                        progress=False, store=store)  # fmt: skip
    torch.testing.assert_close(read.similarity, ran.similarity)
    assert read.labels == ran.labels and read.options["store"] == str(store.folder)
    with pytest.raises(ValueError, match="needs the images"):
        clip_dissect(model, None, TEXTS, STREAM, model, WordTokenizer(["red"]), store=store)


def test_refusals_leave_the_model_as_it_was():
    model = _planted_vit().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    images, image_text, _ = _planted_probe()
    with pytest.raises(ValueError, match="one or more"):
        clip_dissect(model, images, [], STREAM, image_text=image_text[:, :0], progress=False)
    with pytest.raises(ValueError, match="distinct"):
        clip_dissect(model, images, ["a", "a"], STREAM, image_text=image_text[:, :2])
    with pytest.raises(ValueError, match="probe set holds 30 images"):
        clip_dissect(model, images, TEXTS, STREAM, image_text=image_text[:-1], progress=False)
    with pytest.raises(ValueError, match="similarity must be one of"):
        clip_dissect(model, images, TEXTS, STREAM, image_text=image_text, similarity="iou")
    with pytest.raises(ValueError, match="top"):
        clip_dissect(model, images, TEXTS, STREAM, image_text=image_text, top=0)
    with pytest.raises(ValueError, match="not both, not neither"):
        clip_dissect(model, images, TEXTS, STREAM, progress=False)
    shuffled = DataLoader(TensorDataset(images), batch_size=4, shuffle=True)
    with pytest.raises(ValueError, match="shuffle"):
        clip_dissect(model, shuffled, TEXTS, STREAM, image_text=image_text, progress=False)
    with pytest.raises(ValueError, match="not a token stream"):
        clip_dissect(model, images, TEXTS, "blocks.0.attn.hook_pattern", image_text=image_text)
    assert model.training and all(m.training for m in model.modules())
    assert not _hooks_and_grads(model)
    clip_dissect(model, images, TEXTS, STREAM, image_text=image_text, progress=False)
    assert model.training and not _hooks_and_grads(model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_clip_dissection_round_trips_to_dict():
    images, image_text, _ = _planted_probe()
    result = clip_dissect(_planted_vit(), images, TEXTS, STREAM, image_text=image_text,
                          progress=False)  # fmt: skip
    back = Result.from_dict(json.loads(json.dumps(result.to_dict(), allow_nan=False)))
    assert isinstance(back, CLIPDissection) and back.to_dict() == result.to_dict()
    assert back.table(3) == result.table(3) and back.image_size == (SIZE, SIZE)
    assert result.table(1)[0][1] in PLANTED
