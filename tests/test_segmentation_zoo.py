"""A segmentation model in the zoo (issue 74, item 5): the Shape masks' pixel labels are the
generator's own object masks, checked against the pixels; the trainer's per-pixel loss and its
held-out mean IoU and pixel accuracy, checked by hand and against transformers' own
post-processing; then the zoo's DPT trained on them: its mean IoU far above chance (the
premise), and its maps of one shape's class over the image lying inside that shape's mask far
more than the same architecture's with random weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import vizkit as vk
from vizkit.datasets.shape_masks import MASK_CLASSES, ShapeMasks, pixel_labels
from vizkit.models.segmentation import dpt_masks
from vizkit.train import TrainConfig, loss_and_accuracy, train
from vizkit.train.dense import pixel_logits, segmentation_scores
from vizkit.train.recipes import load_recipe, run_recipe, sample_accuracy

transformers = pytest.importorskip("transformers")


def test_pixel_labels_are_the_generators_object_masks():
    data = ShapeMasks("test", n=48)
    images, labels, masks = vk.datasets.render_shapes(48, split="test")
    assert data.classes == ("background", *vk.datasets.SHAPE_CLASSES) == MASK_CLASSES
    assert torch.equal(data.masks, torch.from_numpy(masks))
    for i in range(48):  # one shape per image, 1 + its Shapes class, on its mask only
        assert set(data.labels[i].unique().tolist()) == {0, 1 + int(labels[i])}
        assert torch.equal(data.labels[i] > 0, data.masks[i])
    # against the pixels: the scene drawn without its object differs from it nowhere outside
    # the mask, and on (nearly) every pixel of it, which holds one colour per image
    removed = vk.datasets.render_shapes(48, split="test", objects=np.full(48, -1))[0]
    differs = (images != removed).any(-1)
    assert not (differs & ~masks).any()
    assert (differs & masks).sum() >= 0.99 * masks.sum()
    for i in range(8):
        colours = images[i][masks[i]].astype(int)
        assert (colours.max(0) - colours.min(0) <= 1).all()
    image, label, mask = data[0]
    assert image.shape == (3, 32, 32) and label.dtype == torch.int64 and mask.dtype == torch.bool
    with pytest.raises(ValueError, match="Shapes classes in 0..9"):
        pixel_labels(torch.tensor([10]), torch.ones(1, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="split must be one of"):
        ShapeMasks("val")


class Constant(nn.Module):
    """Logits (B, K, 8, 8) that always pick class ``picked``."""

    def __init__(self, classes: int, picked: int) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(classes))
        self.picked = picked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.logits.detach().clone()
        logits[self.picked] = 1.0
        return logits[None, :, None, None].expand(len(x), -1, 8, 8)


def test_mean_iou_and_pixel_accuracy_by_hand():
    data = ShapeMasks("test", n=40)
    scores = segmentation_scores(Constant(11, picked=0), data, batch_size=16)
    background = (data.labels == 0).float().mean().item()
    shapes = len(data.labels.unique()) - 1  # present: their IoU is 0, the background's its share
    assert scores["accuracy"] == pytest.approx(background)
    assert scores["miou"] == pytest.approx(background / (1 + shapes))
    assert loss_and_accuracy(Constant(11, picked=0), data)["miou"] == pytest.approx(scores["miou"])
    with pytest.raises(ValueError, match=r"classes in 0..4 .* labels in 0..10.*num_labels 11"):
        segmentation_scores(Constant(5, picked=0), data)


def test_logits_are_resized_as_transformers_post_processing_does():
    torch.manual_seed(0)
    model = dpt_masks(11, hidden_size=16, heads=2, neck=(8, 8, 16, 16), fusion=8).eval()
    data = ShapeMasks("test", n=4)
    x = torch.stack([data[i][0] for i in range(4)])
    with torch.no_grad():
        output = model(x)
    ours = pixel_logits(output, (32, 32))
    assert output.logits.shape == (4, 11, 64, 64) and ours.shape == (4, 11, 32, 32)
    theirs = transformers.DPTImageProcessor().post_process_semantic_segmentation(
        output, target_sizes=[(32, 32)] * 4
    )
    assert all(torch.equal(ours[i].argmax(0), theirs[i]) for i in range(4))


def test_the_trainer_learns_per_pixel_and_refuses_what_moves_the_images():
    train_set, test_set = ShapeMasks("train", n=128), ShapeMasks("test", n=32)
    torch.manual_seed(0)
    model = dpt_masks(11, hidden_size=16, heads=2, neck=(8, 8, 16, 16), fusion=8)
    before = loss_and_accuracy(model, train_set)["loss"]
    config = TrainConfig(epochs=1, batch_size=32, lr=3e-3, warmup_epochs=0.2, threads=1)
    (record,) = train(model, train_set, test_set, config, progress=False)
    assert loss_and_accuracy(model, train_set)["loss"] < before
    assert 0 <= record["test_miou"] <= record["test_accuracy"] <= 1
    with pytest.raises(ValueError, match="augment, mixup move or mix the images"):
        train(model, train_set, test_set, TrainConfig(augment=True, mixup=0.8), progress=False)
    with pytest.raises(ValueError, match="at least 4"):
        dpt_masks(11, layers=3)


def test_a_recipe_pairs_the_masks_with_a_segmentation_architecture(tmp_path):
    assert load_recipe("dpt_shape_masks")["data"] == "shape_masks"
    recipe = tmp_path / "recipe.json"
    recipe.write_text(
        '{"name": "x", "architecture": "vit_tiny_patch16_224", "kwargs": {}, "data": '
        '"shape_masks", "train": {}}'
    )
    with pytest.raises(ValueError, match="trains a segmentation architecture"):
        load_recipe(recipe)


@pytest.mark.slow
def test_a_segmentation_recipe_trains_writes_and_loads_from_its_card(tmp_path):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(
        '{"name": "tiny_masks", "architecture": "dpt_masks", "kwargs": {"num_labels": 11, '
        '"hidden_size": 16, "heads": 2, "neck": [8, 8, 16, 16], "fusion": 8}, "data": '
        '"shape_masks", "track": [], "train": {"epochs": 1, "batch_size": 64, "threads": 1}}'
    )
    card = run_recipe(recipe, out_dir=tmp_path / "zoo", progress=False, readme=False)
    assert card["classes"] == list(MASK_CLASSES) and card["pretrained_cfg"]["num_classes"] == 11
    assert 0 < card["test_miou"] <= card["test_accuracy"] <= 1
    model, loaded = vk.zoo.load(tmp_path / "zoo" / "tiny_masks.safetensors")
    assert type(model).__name__ == "DPTForSemanticSegmentation"
    assert loaded["sha256"] == card["sha256"]
    assert sample_accuracy(model, "shape_masks") == card["sample_accuracy"]


# Methods whose maps of an object's class, its logits summed over the whole image, lie on that
# object (median share of the positive map on its mask over 40 held-out images; the object
# covers a median 0.15 of the image). Measured 2026-12-07 with the zoo model (mean IoU 0.43 on
# the 512 test images): AttnLRP 0.53, IG 0.60; the random model's 0.30 and 0.25. Held to 0.4
# and 0.12 above the random model's. Grad-CAM (0.12 at its default layer, 0.11-0.35 at the
# others; random 0.13-0.21) and the input gradient (0.17; random 0.17) do not, and are not
# asked to: DPT's decoder reads four blocks, and the gradient is noisy per pixel.
ON_THE_OBJECT = [
    ("attnlrp", {}),
    pytest.param("integrated_gradients", {"n_steps": 8}, marks=pytest.mark.slow),
]
MIOU_FLOOR, ACCURACY_MARGIN = 0.3, 0.04  # measured on the 40: 0.40 and 0.91 (background 0.85)


@pytest.fixture(scope="module")
def segmenter():
    model, card = vk.zoo.load("dpt_shape_masks")
    data = ShapeMasks("test", n=40)
    x = torch.stack([data[i][0] for i in range(len(data))])
    torch.manual_seed(0)
    random = dpt_masks(**card["kwargs"]).eval()
    return model, random, x, data


def test_the_zoo_model_segments_far_above_chance(segmenter):
    model, _, _, data = segmenter
    scores = loss_and_accuracy(model, data)
    background = (data.labels == 0).float().mean().item()  # all-background's pixel accuracy
    chance = background / len(data.labels.unique())  # and its mean IoU
    assert scores["miou"] > MIOU_FLOOR and scores["miou"] > 4 * chance, (scores, chance)
    assert scores["accuracy"] > background + ACCURACY_MARGIN


@pytest.mark.parametrize(("method", "options"), ON_THE_OBJECT)
def test_maps_of_an_objects_class_lie_on_its_mask(segmenter, method, options):
    model, random, x, data = segmenter
    trained, untrained = (
        vk.metrics.mask_shares(m, x, data.masks, data.objects, method, **options).median()
        for m in (model, random)
    )
    assert trained > 0.4 and trained > untrained + 0.12, (trained, untrained)
