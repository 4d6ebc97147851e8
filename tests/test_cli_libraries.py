"""Models of other libraries by name (`vizkit.models.libraries`): ``--model
transformers:<folder>`` runs the report from a folder written by save_pretrained (nothing
downloaded), with the model's own classes and normalization; wrong names are refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import vizkit as vk

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A small ViT classifier and its image processor, saved as from_pretrained reads them."""
    path = tmp_path_factory.mktemp("hf_vit")
    torch.manual_seed(0)
    labels = {0: "cat", 1: "dog", 2: "fox"}
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=3, id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )  # fmt: skip
    transformers.ViTForImageClassification(config).save_pretrained(path)
    transformers.ViTImageProcessor(
        size={"height": 32, "width": 32}, image_mean=[0.4, 0.4, 0.4], image_std=[0.2, 0.2, 0.2]
    ).save_pretrained(path)
    return path


def test_a_transformers_folder_loads_with_its_classes_and_normalization(folder):
    model, card = vk.zoo.load(f"transformers:{folder}")
    assert card["classes"] == ["cat", "dog", "fox"] and card["input_size"] == (3, 32, 32)
    assert card["mean"] == (0.4, 0.4, 0.4) and card["std"] == (0.2, 0.2, 0.2)
    config = vk.datasets.model_input.model_data_config(model)
    assert config["input_size"] == (3, 32, 32) and config["mean"] == (0.4, 0.4, 0.4)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), model.model(x).logits)  # logits of the ModelOutput
    assert vk.HookedModel(model).family.root == "model.vit"


def test_the_report_runs_on_a_transformers_model(folder, tmp_path):
    out = tmp_path / "report"
    command = [sys.executable, "-m", "vizkit.cli", "report", "--model", f"transformers:{folder}",
               "--data", "digits", "--n", "4", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    page = (out / "index.html").read_text()
    assert "ViTForImageClassification (transformers" in page
    for section in ("Attention rollout", "Saliency methods compared", "Residual-norm ratios"):
        assert section in page


def test_wrong_library_names_are_refused():
    with pytest.raises(ValueError, match="classifies only against text prompts"):
        vk.zoo.load("open_clip:ViT-B-32")
    with pytest.raises(ValueError, match="torchvision has no model 'vit_z_99'"):
        vk.zoo.load("torchvision:vit_z_99")
    with pytest.raises(ValueError, match="expected <library>:<model>"):
        vk.models.libraries.load_library_model("transformers:")
    with pytest.raises(ValueError, match="apply to timm names"):
        vk.zoo.load("torchvision:vit_b_16", pretrained=True)


def test_a_torchvision_builder_loads_with_random_weights():
    model, card = vk.zoo.load("torchvision:vit_b_16")
    assert card["weights"] == "random" and card["input_size"] == (3, 224, 224)
    assert vk.HookedModel(model).family.family == "vit"
