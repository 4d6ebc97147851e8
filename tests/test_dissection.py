"""Network Dissection (`vizkit.concepts`): planted units found with IoU 1, IoU against a hand
computation, the shipped Shapes ViT's channels and an autoencoder's latents as units, refusals,
the model left as it was, and the result's round trip."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import patch_mean_vit
from torch.utils.data import DataLoader, TensorDataset

import vizkit as vk
from vizkit.analysis.result import Result
from vizkit.concepts import Concepts, Dissection, dissect, shapes_concepts
from vizkit.concepts import dissection as dissection_module

SIZE, PATCH = 16, 4  # a 4 x 4 patch grid
STREAM = "blocks.0.hook_resid_pre"  # the patch embedding: what the planted units are made of


def _planted_vit() -> torch.nn.Module:
    """Channel 0 of the patch embedding: the mean of image channel 0 over the patch; channel 1:
    0 everywhere."""
    return patch_mean_vit(SIZE, PATCH, means=1, zeros=1)


def _planted_images(count: int = 12) -> tuple[torch.Tensor, Concepts]:
    """Images whose channel 0 is 1 on a few random whole patches ("planted") and 0 elsewhere,
    the other channels noise; concepts: the planted patches, and other random patches.

    Planted patches lie at even rows and columns, none beside another: upsampled bilinearly,
    each planted pixel is then at least 0.625² (0.39) and every other pixel at most 0.375, so a
    threshold between them gives the planted mask exactly."""
    generator = torch.Generator().manual_seed(1)
    grid = SIZE // PATCH
    planted = torch.zeros(count, grid, grid, dtype=torch.bool)
    planted[:, ::2, ::2] = torch.rand(count, grid // 2, grid // 2, generator=generator) < 0.5
    planted[:, 0, 0] = True  # every image has one
    other = torch.rand(count, grid, grid, generator=generator) < 0.3
    up = lambda m: m.repeat_interleave(PATCH, 1).repeat_interleave(PATCH, 2)  # noqa: E731
    images = torch.randn(count, 3, SIZE, SIZE, generator=generator)
    images[:, 0] = up(planted).float()
    return images, Concepts(["planted", "other"], torch.stack([up(planted), up(other)], 1))


def _hooks_and_grads(model: torch.nn.Module) -> bool:
    """Whether any module holds a hook or any parameter a gradient."""
    hooked = any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                 for m in model.modules())  # fmt: skip
    return hooked or any(p.grad is not None for p in model.parameters())


def test_planted_unit_has_iou_one_and_a_constant_unit_none():
    model = _planted_vit()
    images, concepts = _planted_images()
    patches = concepts.masks[:, 0, ::PATCH, ::PATCH].sum().item()
    total = concepts.masks[:, 0, ::PATCH, ::PATCH].numel()
    # the threshold 0.383 of the way from the unplanted patches' 0 to the planted ones' 1:
    # between 0.375 and 0.39 (rank total - patches - 1 + 0.383 of total - 1, from 0)
    quantile = 1 - (total - patches - 1 + 0.383) / (total - 1)
    result = dissect(model, images, concepts, STREAM, quantile=quantile, batch_size=5,
                     progress=False)  # fmt: skip
    assert result.units[0] == f"{STREAM} 0" and len(result.units) == 16
    assert result.iou[0, 0].item() == pytest.approx(1.0, abs=1e-6)
    assert result.labels[0] == "planted" and bool(result.detectors[0])
    assert result.table(1) == [(f"{STREAM} 0", "planted", pytest.approx(1.0, abs=1e-6))]
    share = concepts.masks.float().mean((0, 2, 3))
    assert (result.iou[1] <= share).all() and not result.detectors[1]
    assert result.detector_counts()["planted"] >= 1


def test_iou_equals_a_hand_computation_whatever_the_batches_and_chunks(monkeypatch):
    model = _planted_vit()
    images, concepts = _planted_images(16)
    name, quantile = "blocks.0.hook_resid_post", 0.05
    result = dissect(model, images, concepts, name, quantile=quantile, batch_size=16,
                     progress=False)  # fmt: skip
    with torch.no_grad():
        _, cache = vk.hooks.HookedModel(model).run_with_cache(images, [name])
    grid = cache[name][:, 1:].transpose(1, 2).unflatten(-1, (SIZE // PATCH, -1))  # (B, C, 4, 4)
    up = F.interpolate(grid, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    values = grid.transpose(0, 1).flatten(1)  # (U, patches): the threshold's (Bau et al.)
    thresholds = torch.quantile(values, 1 - quantile, dim=1)
    fired = up > thresholds[None, :, None, None]  # (B, U, H, W)
    truth = concepts.masks
    inter = (fired[:, :, None] & truth[:, None]).sum((0, 3, 4)).double()
    union = (fired[:, :, None] | truth[:, None]).sum((0, 3, 4)).double()
    torch.testing.assert_close(result.thresholds, thresholds, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.iou.double(), inter / union, rtol=0, atol=0.01)
    monkeypatch.setattr(dissection_module, "CHUNK_BYTES", 1)  # one unit per chunk
    loader = DataLoader(TensorDataset(images, torch.zeros(16)), batch_size=3)
    chunked = dissect(model, loader, concepts, name, quantile=quantile, batch_size=7,
                      progress=False)  # fmt: skip
    torch.testing.assert_close(chunked.thresholds, result.thresholds)
    torch.testing.assert_close(chunked.iou, result.iou)


def test_shapes_vit_last_block_has_shape_detectors():
    """The shipped Shapes ViT's last block output (128 channels) on 200 test images: 33
    channels detect a shape class (crescent 17, triangle 10, star 3, square, ring and cross 1
    each, the others 0); the best, channel 72, a triangle at IoU 0.20. "object", "background"
    and the tones label none: at quantile 0.005 a unit's mask is far smaller than any of them
    (IoU at most 0.005 / 0.16)."""
    model, card = vk.zoo.load("vit_tiny_shapes")
    images, concepts = shapes_concepts(200)
    result = dissect(model, images, concepts, "blocks.3.hook_resid_post", progress=False)
    assert result.iou.shape == (128, len(concepts.names)) and len(result.units) == 128
    assert concepts.names[:10] == card["classes"]
    counts = result.detector_counts()
    shape_detectors = {c: counts[c] for c in card["classes"]}
    assert sum(shape_detectors.values()) >= 20, counts
    assert sum(n > 0 for n in shape_detectors.values()) >= 4, counts
    assert result.options == {"quantile": 0.005, "threshold": 0.04, "units": "channels",
                              "layer": "blocks.3.hook_resid_post", "store": None}  # fmt: skip


def test_shapes_concepts_are_the_generators_masks():
    images, concepts = shapes_concepts(20, seed=3)
    shapes = vk.datasets.Shapes("test", n=20, seed=3)
    assert torch.equal(images[4], shapes[4][0])
    masks = concepts.masks
    objects = masks[:, concepts.names.index("object")]
    assert torch.equal(objects, shapes.masks)
    assert torch.equal(masks[:, :10].sum(1), objects.long())  # one class per object
    assert torch.equal(masks[:, 10 + 2] | masks[:, 10 + 3], objects)  # dark or bright
    assert not (masks[:, 10 + 2] & masks[:, 10 + 3]).any()
    label = int(shapes.labels[0])
    assert torch.equal(masks[0, label], shapes.masks[0])


def test_autoencoder_latents_as_units(shapes_sae):
    model, sae = shapes_sae
    images, concepts = shapes_concepts(40)
    result = dissect(model, images, concepts, sae, batch_size=16, progress=False)
    assert result.units[:2] == ["latent 0", "latent 1"] and len(result.units) == sae.latents
    assert result.iou.shape == (sae.latents, len(concepts.names))
    assert result.options["units"] == "sae" and result.options["layer"] == sae.source["layer"]
    assert ((result.iou >= 0) & (result.iou <= 1)).all()
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.head.bias += 1
    with pytest.raises(ValueError, match="another model"):
        dissect(other, images, concepts, sae, progress=False)


def test_units_read_from_a_store_equal_the_units_read_by_the_model(tmp_path, shapes_sae):
    """Channels and latents read from an activation store (no pass over the model) give the
    dissection of the model's own forward: the same thresholds and IoU."""
    model, sae = shapes_sae
    images, concepts = shapes_concepts(24)
    layer = sae.source["layer"]
    store = vk.cache_activations(model, images, tmp_path / "all", layers=[layer], tokens="all",
                                 progress=False)  # fmt: skip
    calls = []
    for units in (layer, sae):
        ran = dissect(model, images, concepts, units, batch_size=10, progress=False)
        calls.clear()
        handle = model.register_forward_hook(lambda *_: calls.append(1))
        try:
            read = dissect(model, None, concepts, units, batch_size=7, progress=False,
                           store=store)  # fmt: skip
            checked = dissect(model, images, concepts, units, progress=False, store=store)
        finally:
            handle.remove()
        assert not calls  # the store stands for the forwards
        torch.testing.assert_close(read.thresholds, ran.thresholds, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(read.iou, ran.iou, rtol=0, atol=1e-6)
        assert checked.labels == read.labels and read.options["store"] == str(store.folder)


def test_stores_that_cannot_stand_for_the_units_are_refused(tmp_path, shapes_sae):
    model, sae = shapes_sae
    images, concepts = shapes_concepts(8)
    layer = sae.source["layer"]
    write = lambda name, **kw: vk.cache_activations(  # noqa: E731
        model, images, tmp_path / name, progress=False, **kw
    )
    classes = write("class", layers=[layer], tokens="class")
    with pytest.raises(ValueError, match="not every patch of each image.*tokens='patches'"):
        dissect(model, None, concepts, layer, progress=False, store=classes)
    some = write("some", layers=[layer], tokens=5)
    with pytest.raises(ValueError, match="not every patch"):
        dissect(model, None, concepts, sae, progress=False, store=some)
    other_layer = write("other", layers=["blocks.0.hook_resid_post"], tokens="patches")
    with pytest.raises(ValueError, match="not blocks.*cache_activations"):
        dissect(model, None, concepts, layer, progress=False, store=other_layer)
    store = write("all", layers=[layer], tokens="patches")
    with pytest.raises(ValueError, match="differ from the ones the store"):
        dissect(model, images.flip(0), concepts, layer, progress=False, store=store)
    more = Concepts(concepts.names, torch.cat([concepts.masks, concepts.masks]))
    with pytest.raises(ValueError, match="holds 8 images but the concepts hold masks of 16"):
        dissect(model, None, more, layer, progress=False, store=store)
    smaller = Concepts(concepts.names, concepts.masks[..., :16, :16])
    with pytest.raises(ValueError, match=r"written from \(32, 32\) images"):
        dissect(model, None, smaller, layer, progress=False, store=store)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.head.bias += 1
    with pytest.raises(ValueError, match="not made with this model"):
        dissect(other, None, concepts, layer, progress=False, store=store)
    with pytest.raises(ValueError, match="needs its images"):
        dissect(model, None, concepts, layer, progress=False)


def test_refusals_leave_the_model_as_it_was():
    model = _planted_vit().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    images, concepts = _planted_images()
    fewer = Concepts(concepts.names, concepts.masks[:-1])
    with pytest.raises(ValueError, match="holds 12 images but the concepts hold masks of 11"):
        dissect(model, images, fewer, STREAM, progress=False)
    smaller = Concepts(concepts.names, concepts.masks[..., :8, :8])
    with pytest.raises(ValueError, match="concept masks"):
        dissect(model, images, smaller, STREAM, progress=False)
    with pytest.raises(ValueError, match="not a token stream"):
        dissect(model, images, concepts, "blocks.0.attn.hook_pattern", progress=False)
    with pytest.raises(KeyError):
        dissect(model, images, concepts, "blocks.9.hook_resid_post", progress=False)
    for quantile in (0, 1, 1.5):
        with pytest.raises(ValueError, match="quantile"):
            dissect(model, images, concepts, STREAM, quantile=quantile, progress=False)
    shuffled = DataLoader(TensorDataset(images), batch_size=4, shuffle=True)
    with pytest.raises(ValueError, match="shuffle"):
        dissect(model, shuffled, concepts, STREAM, progress=False)
    with pytest.raises(ValueError, match="K = 3"):
        Concepts(["a", "b", "c"], concepts.masks)
    with pytest.raises(TypeError, match="bool"):
        Concepts(concepts.names, concepts.masks.float())
    assert model.training and all(m.training for m in model.modules())
    assert not _hooks_and_grads(model)
    dissect(model, images, concepts, STREAM, progress=False)
    assert model.training and not _hooks_and_grads(model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_dissection_round_trips_to_dict():
    model = _planted_vit()
    images, concepts = _planted_images()
    result = dissect(model, images, concepts, STREAM, progress=False)
    back = Result.from_dict(json.loads(json.dumps(result.to_dict(), allow_nan=False)))
    assert isinstance(back, Dissection) and back.to_dict() == result.to_dict()
    assert back.table(3) == result.table(3) and back.image_size == (SIZE, SIZE)


def test_the_guide_example_prints_what_the_guide_says():
    from guide_example import run_first_example

    printed, said = run_first_example("concepts.md")
    assert printed == said
