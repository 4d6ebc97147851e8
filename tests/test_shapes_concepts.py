"""What the Shapes generator knows beyond the masks of `shapes_concepts`: each image's class, the
truth a unit's name is checked against (`truth_units`), and how strongly its background is
striped (`background_contrast`, `striped_scenes`), a concept for TCAV."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

import vizkit as vk
from vizkit.concepts import image_auc, shapes_concepts
from vizkit.concepts.shapes_concepts import background_contrast, striped_scenes, truth_units
from vizkit.datasets.shapes import _SPLIT_IDS


def _gratings(n: int, size: int = 32, seed: int = 0, split: str = "test") -> np.ndarray:
    """(n, H, W, 3) the base colour and two gratings of each image, as `render_shapes` draws
    them (its first draws, replayed): the background before noise and distractors."""
    rng = np.random.Generator(np.random.PCG64([seed, _SPLIT_IDS[split], size]))
    rng.permutation(n)  # the labels
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size * 2 - 1
    gy, gx = np.meshgrid(coords, coords, indexing="ij")
    background = np.broadcast_to(rng.uniform(0.2, 0.8, (n, 1, 1, 3)), (n, size, size, 3)).copy()
    for _ in range(2):
        freq, angle = rng.uniform(1.5, 6.0, (n, 1, 1)), rng.uniform(0, math.pi, (n, 1, 1))
        phase = rng.uniform(0, 2 * math.pi, (n, 1, 1))
        wave = np.sin(freq * math.pi * (gx * np.cos(angle) + gy * np.sin(angle)) + phase)
        background += wave[..., None] * rng.uniform(-0.08, 0.08, (n, 1, 1, 3))
    return background


def test_contrast_orders_the_scenes_by_their_gratings():
    """On 300 object-free test scenes the replayed gratings are the scenes' backgrounds (up to
    the pixel noise of 0.04 and the distractors), and the contrast ranks the scenes as the
    gratings' own spread does (rank correlation 0.97 measured; 0.9 asserted)."""
    n = 300
    _, scenes, _, _ = vk.datasets.counterfactual_shapes(n, replace="none")
    pixels = (scenes * 0.25 + 0.5).permute(0, 2, 3, 1).numpy()  # [0, 1]
    background = _gratings(n)
    assert np.median(np.abs(pixels - background)) < 0.05  # the replay is the generator's
    truth = (background - background.mean((1, 2), keepdims=True)).reshape(n, -1).std(1)
    assert spearmanr(background_contrast(scenes).numpy(), truth).statistic > 0.9


def test_contrast_is_a_robust_spread_outside_the_masks():
    flat = torch.full((2, 3, 16, 16), 0.5)
    striped = flat + 0.1 * torch.sin(torch.arange(16.0))[None, None, None, :]
    contrast = background_contrast(torch.cat([flat, striped]))
    assert contrast.shape == (4,) and contrast.dtype == torch.float32
    assert torch.equal(contrast[:2], torch.zeros(2)) and bool((contrast[2:] > 0.05).all())
    # an object masked out counts for nothing; in the background it counts
    with_object = striped.clone()
    masks = torch.zeros(4, 16, 16, dtype=torch.bool)
    masks[:, 4:12, 4:12] = True
    with_object[:, :, 4:12, 4:12] = torch.rand(
        2, 3, 8, 8, generator=torch.Generator().manual_seed(0)
    )
    mixed = torch.cat([flat, with_object])
    outside = background_contrast(mixed, masks)
    unmasked = striped.clone()
    unmasked[:, :, 4:12, 4:12] = float("nan")
    expected = torch.nanquantile(unmasked.flatten(2), torch.tensor([0.25, 0.75]), dim=2)
    spread = ((expected[1] - expected[0]) / 1.349).pow(2).mean(1).sqrt()
    assert torch.allclose(outside[2:], spread) and torch.equal(outside[:2], torch.zeros(2))
    # an affine map of the values (uint8, normalized) keeps the order
    _, scenes, _, _ = vk.datasets.counterfactual_shapes(40, replace="none")
    as_bytes = ((scenes * 0.25 + 0.5) * 255).round()
    assert torch.equal(
        background_contrast(scenes).argsort(), background_contrast(as_bytes).argsort()
    )


def test_contrast_refusals():
    with pytest.raises(ValueError, match=r"\(n, C, H, W\)"):
        background_contrast(torch.zeros(3, 8, 8))
    with pytest.raises(TypeError, match="bool"):
        background_contrast(torch.zeros(2, 3, 8, 8), torch.zeros(2, 8, 8))
    with pytest.raises(ValueError, match="one per image"):
        background_contrast(torch.zeros(2, 3, 8, 8), torch.zeros(3, 8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="no background"):
        background_contrast(torch.zeros(2, 3, 8, 8), torch.ones(2, 8, 8, dtype=torch.bool))


def test_striped_scenes_are_the_object_free_scenes_of_most_contrast():
    striped, others = striped_scenes(60, 10, seed=2)
    _, scenes, _, _ = vk.datasets.counterfactual_shapes(60, seed=2, replace="none")
    assert striped.shape == (10, 3, 32, 32) and others.shape == (50, 3, 32, 32)
    high, rest = background_contrast(striped), background_contrast(others)
    assert float(high.min()) >= float(rest.max())
    assert bool((high[:-1] >= high[1:]).all())  # strongest first
    contrast = background_contrast(scenes)
    chosen = contrast.argsort(descending=True, stable=True)[:10]
    assert torch.equal(striped, scenes[chosen])
    kept = torch.ones(60, dtype=torch.bool)
    kept[chosen] = False
    assert torch.equal(others, scenes[kept])  # the generator's order
    with pytest.raises(ValueError, match="below n=5"):
        striped_scenes(5, 5)


def test_truth_units_are_each_classs_best_unit_by_image_maxima():
    """The hand computation: each neuron's largest value over each image's patch tokens, its
    AUC for each class, the best unit per class."""
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images, concepts = shapes_concepts(60, seed=1)
    layer = "blocks.3.mlp.act.hook_out"
    units, auc = truth_units(model, layer, images, concepts)
    _, cache = vk.HookedModel(model).run_with_cache(images, [layer])
    maxima = cache[layer][:, 1:].amax(1)  # (N, 384): the class token left out
    present = concepts.masks[:, :10].flatten(2).any(2)
    expected = image_auc(maxima, present)
    assert torch.equal(units, expected.argmax(1))
    assert torch.allclose(auc, expected.max(1).values.float())
    assert bool((auc > 0.7).all()), auc  # each class has a neuron that tells it apart
    with pytest.raises(ValueError, match="Concepts of the 59 images"):
        truth_units(model, layer, images[1:], concepts)


def test_truth_units_of_latents(shapes_sae):
    model, sae = shapes_sae
    images, concepts = shapes_concepts(40, seed=1)
    units, auc = truth_units(model, sae, images, concepts)
    assert units.shape == (10,) and bool((units < sae.latents).all())
    assert bool((auc >= 0.5).all() and (auc <= 1).all())


def test_the_objects_attributes_are_concepts_over_its_mask():
    """Size, position and tint as the generator drew them, checked against the drawn pixels
    with margins no rounding crosses; the distractors apart from the object; the same images
    with and without the generator's details."""
    from vizkit.datasets.shapes import render_shapes

    n = 200
    _, concepts = shapes_concepts(n, seed=5)
    plain = render_shapes(n, seed=5, split="test")
    images, _, objects, drawn = render_shapes(n, seed=5, split="test", details=True)
    assert all(np.array_equal(a, b) for a, b in zip(plain, (images, _, objects), strict=True))
    masks = {name: concepts.masks[:, i] for i, name in enumerate(concepts.names)}
    present = {name: m.flatten(1).any(1) for name, m in masks.items()}
    whole = masks["object"]
    for pair in (("small object", "large object"), ("object on the left", "object on the right"),
                 ("object at the top", "object at the bottom")):  # fmt: skip
        assert torch.equal(masks[pair[0]] | masks[pair[1]], whole)
        assert not (masks[pair[0]] & masks[pair[1]]).any()
    tints = ["red-tinted object", "green-tinted object", "blue-tinted object"]
    assert torch.equal(sum(masks[t].long() for t in tints), whole.long())
    area = whole.flatten(1).sum(1).float()
    assert area[present["large object"]].mean() > 1.3 * area[present["small object"]].mean()
    ys, xs = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    centroid_x = (whole * xs).flatten(1).sum(1) / area.clamp_min(1)
    centroid_y = (whole * ys).flatten(1).sum(1) / area.clamp_min(1)
    far_x = torch.from_numpy(np.abs(drawn["centre"][:, 0]) > 0.25)
    far_y = torch.from_numpy(np.abs(drawn["centre"][:, 1]) > 0.25)
    assert torch.equal((centroid_x < 15.5)[far_x], present["object on the left"][far_x])
    assert torch.equal((centroid_y < 15.5)[far_y], present["object at the top"][far_y])
    colour = (torch.from_numpy(images).float() * whole[..., None]).flatten(1, 2).sum(1)
    hue = np.sort(drawn["hue"], axis=1)
    clear = torch.from_numpy(hue[:, 2] - hue[:, 1] > 0.05)  # one channel clearly strongest
    tint = torch.stack([present[t] for t in tints], 1).float().argmax(1)
    assert torch.equal(colour.argmax(1)[clear], tint[clear]) and int(clear.sum()) > 100
    distractors = masks["distractor"]
    assert not (distractors & whole).any() and present["distractor"].float().mean() > 0.9
