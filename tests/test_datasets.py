"""Shapes and Digits: determinism, exact masks, balance, fixed splits."""

import numpy as np
import pytest
import torch

from vizkit.datasets import SHAPE_CLASSES, Digits, Shapes, render_shapes


def test_same_seed_same_bytes_other_seed_other_images():
    a = render_shapes(50, seed=3)
    b = render_shapes(50, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    other = render_shapes(50, seed=4)[0]
    test_split = render_shapes(50, seed=3, split="test")[0]
    assert not np.array_equal(a[0], other) and not np.array_equal(a[0], test_split)


def test_mask_is_exactly_the_drawn_object():
    images, labels, masks = render_shapes(200, seed=1)
    for image, mask in zip(images, masks, strict=True):
        assert mask.sum() >= 20, "target too small to classify"
        target = image[mask]  # (k, 3): the object is one flat colour, drawn last
        assert (target == target[0]).all()
        outside = image[~mask]
        assert (outside == target[0]).all(-1).mean() < 0.01  # no second object of that colour


def test_classes_are_balanced_and_labels_valid():
    shapes = Shapes("test", n=300)
    counts = torch.bincount(shapes.labels, minlength=len(SHAPE_CLASSES))
    assert counts.tolist() == [30] * 10
    image, label, mask = shapes[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert mask.shape == (32, 32) and mask.dtype == torch.bool and 0 <= label < 10
    assert -2.1 <= image.min() and image.max() <= 2.1  # (x - 0.5) / 0.25 of [0, 1]


def test_other_sizes_and_bad_arguments():
    assert Shapes("test", n=10, size=48)[0][0].shape == (3, 48, 48)
    with pytest.raises(ValueError, match="split"):
        Shapes("validation", n=10)
    with pytest.raises(ValueError, match="at least 16"):
        Shapes("test", n=10, size=8)
    with pytest.raises(ValueError, match="at least 1"):
        Shapes("test", n=0)


def test_digits_fixed_stratified_split():
    train, test = Digits("train"), Digits("test")
    assert (len(train), len(test)) == (1437, 360)
    assert torch.equal(Digits("test").images, test.images)
    assert torch.bincount(test.labels).min() >= 35
    image, label = train[0]
    assert image.shape == (3, 32, 32) and 0 <= label <= 9
    with pytest.raises(ValueError, match="split"):
        Digits("val")


def test_image_folder(tmp_path):
    import timm
    from PIL import Image

    from vizkit.datasets import ImageFolder

    model = timm.create_model("test_vit")  # pretrained_cfg: 160 px
    Image.new("RGB", (50, 40), (255, 0, 0)).save(tmp_path / "b.png")
    Image.new("L", (64, 64), 128).save(tmp_path / "a.jpg")
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    Image.new("RGB", (64, 64)).save(tmp_path / "cut.jpg")
    (tmp_path / "cut.jpg").write_bytes((tmp_path / "cut.jpg").read_bytes()[:300])
    with pytest.warns(
        UserWarning,
        match=r"broken.png \(.*\); cut.jpg \(Truncated.*notes.txt \(not an image\)",
    ):
        folder = ImageFolder(tmp_path, model)
    assert [f.name for f in folder.files] == ["a.jpg", "b.png"]
    assert [f.name for f in ImageFolder(tmp_path, model, limit=1).files] == ["a.jpg"]
    image, name = folder[1]
    assert image.shape == (3, 160, 160) and name == "b.png"
    config = timm.data.resolve_data_config({}, model=model)
    red = (1.0 - config["mean"][0]) / config["std"][0]  # normalized red channel of pure red
    assert torch.allclose(image[0], torch.full((160, 160), red), atol=1e-3)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no readable image"):
        ImageFolder(empty, model)
    with pytest.raises(FileNotFoundError):
        ImageFolder(tmp_path / "missing", model)


def test_committed_sample_matches_the_generator():
    from vizkit.datasets import load_sample
    from vizkit.datasets.shapes import SAMPLE_FILE, SAMPLE_SIZE

    with np.load(SAMPLE_FILE) as sample:
        images, labels, masks = render_shapes(SAMPLE_SIZE, seed=0, split="test")
        assert np.array_equal(sample["labels"], labels) and np.array_equal(sample["masks"], masks)
        # np.sin may differ by an ulp across CPUs; after rounding to uint8 that is one level at most
        diff = np.abs(sample["images"].astype(int) - images.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
    norm_images, norm_labels, norm_masks = load_sample()
    shapes = Shapes("test", n=SAMPLE_SIZE)
    assert torch.allclose(
        norm_images,
        torch.stack([shapes[i][0] for i in range(SAMPLE_SIZE)]),
        atol=1 / 255 / 0.25 + 1e-6,
    )
    assert torch.equal(norm_labels, shapes.labels) and torch.equal(norm_masks, shapes.masks)


def test_a_second_dataset_of_the_same_arguments_is_an_independent_copy():
    first = Shapes("test", n=40)
    first.images.zero_(), first.labels.fill_(3), first.masks.fill_(True)
    second, fresh = Shapes("test", n=40), render_shapes(40, split="test")
    assert torch.equal(second.images, torch.from_numpy(fresh[0]).permute(0, 3, 1, 2))
    assert torch.equal(second.labels, torch.from_numpy(fresh[1]))
    assert torch.equal(second.masks, torch.from_numpy(fresh[2]))
