"""`load_images` prepares a photo as the model's own library does: timm's eval transform, the
Hugging Face image processor (saved with the checkpoint, or its model type's defaults), and
open_clip's preprocess config, each compared with that library's own preprocessing of the same
photo; ``mean=`` / ``std=`` / ``size=`` replace what was read, and the result says which."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import vizkit as vk

transformers = pytest.importorskip("transformers")
open_clip = pytest.importorskip("open_clip")

TOWER = {"image_size": 224, "patch_size": 16, "hidden_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 2, "intermediate_size": 64}  # fmt: skip


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    """A 400 x 300 photo-like image (not square, so that resizing and cropping matter)."""
    yy, xx = np.mgrid[0:300, 0:400]
    noise = np.random.default_rng(0).integers(0, 40, (300, 400, 3), dtype=np.uint8)
    pixels = np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1).astype(np.uint8) ^ noise
    return Image.fromarray(pixels)


def assert_same_input(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Equal up to resampling arithmetic: at most 2 grey levels (of 255) after normalization
    by a std >= 0.26, and 0.001 on average."""
    assert ours.shape == theirs.shape
    difference = (ours - theirs).abs()
    assert float(difference.max()) < 2 / 255 / 0.26 and float(difference.mean()) < 1e-3


HF_TOWERS = {
    "vit": (transformers.ViTConfig, transformers.ViTModel, transformers.ViTImageProcessor),
    "clip": (
        transformers.CLIPVisionConfig, transformers.CLIPVisionModel,
        transformers.CLIPImageProcessor,
    ),
    "siglip": (
        transformers.SiglipVisionConfig, transformers.SiglipVisionModel,
        transformers.SiglipImageProcessor,
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(HF_TOWERS))
def test_a_transformers_model_from_a_config_takes_its_model_types_processor(kind, photo):
    config, model, processor = HF_TOWERS[kind]
    loaded = vk.datasets.load_images(photo, model(config(**TOWER)))
    expected = processor()(images=photo, return_tensors="pt").pixel_values
    assert_same_input(loaded.x, expected)
    assert processor.__name__ in loaded.preprocessing.source


def test_dinov2_takes_the_statistics_its_checkpoints_save(photo):
    """BitImageProcessor's class defaults are OpenAI CLIP's; facebook/dinov2-* save ImageNet's
    with the shorter side at 256 and a 224 crop: the processor configured as they save it."""
    model = transformers.Dinov2Model(transformers.Dinov2Config(**TOWER))
    loaded = vk.datasets.load_images(photo, model)
    checkpoint = transformers.BitImageProcessor(
        size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224},
        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
    )  # fmt: skip
    assert_same_input(loaded.x, checkpoint(images=photo, return_tensors="pt").pixel_values)


def test_the_processor_saved_with_a_checkpoint_is_read(photo, tmp_path):
    processor = transformers.CLIPImageProcessor(
        size={"shortest_edge": 160}, crop_size={"height": 128, "width": 128},
        image_mean=[0.1, 0.2, 0.3], image_std=[0.3, 0.3, 0.3],
    )  # fmt: skip
    transformers.ViTModel(transformers.ViTConfig(**TOWER)).save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    model = transformers.ViTModel.from_pretrained(tmp_path)
    loaded = vk.datasets.load_images(photo, model)
    assert "saved with the checkpoint" in loaded.preprocessing.source
    assert_same_input(loaded.x, processor(images=photo, return_tensors="pt").pixel_values)


def test_open_clip_models_take_their_preprocess_config(photo):
    model = open_clip.model.CLIP(
        embed_dim=16,
        vision_cfg={"image_size": 224, "patch_size": 16, "width": 32, "layers": 1,
                    "head_width": 16},
        text_cfg={"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1},
    )  # fmt: skip
    defaults = open_clip.image_transform(224, is_train=False)(photo)[None]
    assert_same_input(vk.datasets.load_images(photo, model).x, defaults)
    cfg = {"size": 224, "mode": "RGB", "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
           "interpolation": "bilinear", "resize_mode": "squash", "fill_color": 0}  # fmt: skip
    model.visual.preprocess_cfg = cfg
    preprocess = open_clip.transform.PreprocessCfg(**cfg)
    theirs = open_clip.transform.image_transform_v2(preprocess, is_train=False)(photo)
    loaded = vk.datasets.load_images(photo, model)
    assert_same_input(loaded.x, theirs[None])
    assert loaded.preprocessing.source == "open_clip's preprocess config"
    tower = vk.models.image_tower(model)  # vizkit's wrappers read the model inside
    assert vk.datasets.load_images(photo, tower).preprocessing == loaded.preprocessing


def test_timm_models_take_their_data_config(photo):
    model = timm.create_model("vit_tiny_patch16_224")
    cfg = timm.data.resolve_data_config({}, model=model)
    expected = timm.data.create_transform(**cfg)(photo)[None]
    assert torch.equal(vk.datasets.load_images(photo, model).x, expected)


def test_mean_std_and_size_replace_what_was_read_and_say_so(photo):
    model = timm.create_model("vit_tiny_patch16_224")
    loaded = vk.datasets.load_images(photo, model, mean=(0, 0, 0), std=(1, 1, 1), size=96)
    assert loaded.x.shape == (1, 3, 96, 96)
    torch.testing.assert_close(loaded.x[0].permute(1, 2, 0), torch.from_numpy(
        loaded.shown[0]).float() / 255, atol=1 / 255, rtol=0)  # fmt: skip
    assert "mean, std, input_size given" in loaded.preprocessing.source
    with pytest.raises(ValueError, match="std must be positive"):
        vk.datasets.load_images(photo, model, std=(1, 0, 1))
    with pytest.raises(ValueError, match="one per channel"):
        vk.datasets.load_images(photo, model, mean=(0.5, 0.5))
    with pytest.raises(ValueError, match="size must be"):
        vk.datasets.load_images(photo, model, size=(0, 10))


def test_loaded_images_print_one_line_and_unpack_as_before(photo):
    model = timm.create_model("vit_tiny_patch16_224")
    loaded = vk.datasets.load_images([photo] * 5, model)
    x, shown, names = loaded
    assert x.shape[0] == len(shown) == len(names) == 5
    text = repr(loaded)
    assert "\n" not in text and text.startswith("LoadedImages(5 images (5, 3, 224, 224)")
    assert "timm's data config" in text
