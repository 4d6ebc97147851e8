"""The readout of a model that projects its vision model's pooled output (`ImageTower` of a
transformers ``CLIPModel``, ``CLIPVisionModelWithProjection``) is its family layout's: the
pooled output through the projection, the model's embedding; the blocks, names and root are
those of the vision model inside, also under a wrapper."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vizkit as vk

transformers = pytest.importorskip("transformers")

VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "image_size": 32, "patch_size": 8}  # fmt: skip
TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2}  # fmt: skip
X = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def tower() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.CLIPConfig(vision_config=VISION, text_config=TEXT, projection_dim=16)
    return vk.models.image_tower(transformers.CLIPModel(config).eval())


def projected() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.CLIPVisionConfig(**VISION, projection_dim=16)
    return transformers.CLIPVisionModelWithProjection(config).eval()


@pytest.mark.parametrize("build, root", [(tower, "model.vision_model"),
                                         (projected, "vision_model")])  # fmt: skip
def test_the_readout_projects_the_pooled_output(build, root):
    model = build()
    hm = vk.HookedModel(model)
    assert hm.family.family == "clip" and hm.family.root == root
    last = f"{root}.encoder.layers.1.hook_resid_post"
    with torch.no_grad():
        output, cache = hm.run_with_cache(X, last)
        read = hm.family.readout(cache[last])
    embedding = vk.targets.embedding_of(output)
    assert read.shape == embedding.shape == (3, 16)
    torch.testing.assert_close(read, embedding, rtol=0, atol=1e-5 * float(embedding.abs().max()))


def test_a_wrapped_tower_keeps_the_vision_models_names_and_root():
    model = tower()
    wrapped = nn.Sequential(model).eval()
    inner, outer = vk.HookedModel(model), vk.HookedModel(wrapped)
    assert outer.family.root == "0.model.vision_model"
    assert {f"0.{name}" for name in inner.hook_names()} <= set(outer.hook_names())
    assert f"0.{inner.family.blocks[1].path}" == outer.family.blocks[1].path
    assert not [k for k in model.state_dict() if "readout" in k]  # no second projection
