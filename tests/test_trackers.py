"""Per-epoch trackers: what they store equals the analyses run on the same model and batch, and
tracking does not change what is trained."""

from __future__ import annotations

import json

import pytest
import timm
import torch

import vizkit as vk
from vizkit.datasets import Shapes
from vizkit.train import (
    TRACKERS,
    CKAToPreviousTracker,
    LayerScaleTracker,
    ResidualRatiosTracker,
    TrainConfig,
    train,
)
from vizkit.train.recipes import load_recipe


def layerscale_vit(seed=0):
    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
        num_classes=10, init_values=0.1,
    )  # fmt: skip


def trackers():
    return [cls() for cls in TRACKERS.values()]


def test_history_holds_every_tracked_quantity_and_training_is_unchanged():
    train_set, test_set = Shapes("train", n=128), Shapes("test", n=32)
    config = TrainConfig(epochs=2, batch_size=32, lr=3e-3, warmup_epochs=0.2, threads=1)
    tracked_model, plain_model = layerscale_vit(), layerscale_vit()
    history = train(tracked_model, train_set, test_set, config, trackers(), progress=False)
    plain = train(plain_model, train_set, test_set, config, progress=False)
    tracked_state, plain_state = tracked_model.state_dict(), plain_model.state_dict()
    for name, value in tracked_state.items():
        assert torch.equal(value, plain_state[name]), (
            name
        )  # trackers consume no randomness and change no weight
    assert [h["test_loss"] for h in history] == [h["test_loss"] for h in plain]

    first, last = history
    assert {"residual_ratios", "layerscale", "attention_entropy"} <= set(first)
    assert "cka_to_previous" not in first and "cka_to_previous" in last
    eval_batch = torch.stack([test_set[i][0] for i in range(32)])
    expected = vk.residual_ratios(tracked_model, eval_batch)
    tracked = vk.train.tracked_results(history, "residual_ratios")[-1]
    assert tracked.attn.tolist() == pytest.approx(expected.attn.tolist(), rel=1e-6)
    assert tracked.mlp_unscaled.tolist() == pytest.approx(expected.mlp_unscaled.tolist(), rel=1e-6)
    assert tracked.layers == expected.layers and tracked.image_size == expected.image_size
    gamma = tracked_model.blocks[1].ls2.gamma
    assert last["layerscale"]["mlp"]["max"][1] == pytest.approx(gamma.max().item())
    assert first["layerscale"]["attn"]["mean_abs"] != last["layerscale"]["attn"]["mean_abs"]
    assert all(0 < v <= 1 + 1e-9 for v in last["cka_to_previous"].values())
    json.dumps(history)  # the history goes into the model card


def test_cka_to_previous_is_the_cka_of_the_two_models_outputs():
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    before, after = layerscale_vit(0).eval(), layerscale_vit(1).eval()
    tracker = CKAToPreviousTracker()
    assert tracker(before, 1, x) == {}
    values = tracker(after, 2, x)["cka_to_previous"]
    name = "blocks.1.hook_resid_post"
    feats = [
        vk.HookedModel(m).run_with_cache(x, names=name)[1][name].flatten(1) for m in (before, after)
    ]
    assert values[name] == pytest.approx(vk.cka(*feats), abs=1e-7)  # float32 features


def test_trackers_skip_what_does_not_apply():
    torch.manual_seed(0)
    resnet = timm.create_model("resnet10t", num_classes=10).eval()
    x = torch.randn(8, 3, 32, 32)
    assert ResidualRatiosTracker()(resnet, 1, x) == {}
    assert LayerScaleTracker()(resnet, 1, x) == {}
    plain_vit = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2
    ).eval()
    assert LayerScaleTracker()(plain_vit, 1, x) == {}  # no LayerScale to report
    assert "residual_ratios" in ResidualRatiosTracker()(plain_vit, 1, x)
    tracker = CKAToPreviousTracker()
    tracker(resnet, 1, x)
    assert len(tracker(resnet, 2, x)["cka_to_previous"]) == 4  # the CNN's residual blocks


def test_recipes_name_known_trackers(tmp_path):
    spec = load_recipe("cait_tiny_shapes")
    spec["track"] = ["residual_ratios", "gradient_norms"]
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="unknown track"):
        load_recipe(file)
