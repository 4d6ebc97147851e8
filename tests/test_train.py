"""The trainer learns, is deterministic, records callbacks, restores thread count."""

import json

import pytest
import timm
import torch

from vizkit.datasets import Shapes
from vizkit.train import AttentionEntropyTracker, TrainConfig, loss_and_accuracy, train


def tiny_vit():
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224",
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=10,
    )


def test_one_epoch_lowers_the_loss_and_records_callbacks():
    train_set, test_set = Shapes("train", n=256), Shapes("test", n=64)
    model = tiny_vit()
    before = loss_and_accuracy(model, train_set)["loss"]
    config = TrainConfig(epochs=1, batch_size=32, lr=3e-3, warmup_epochs=0.2, augment=True)
    history = train(
        model, train_set, test_set, config, callbacks=[AttentionEntropyTracker()], progress=False
    )
    assert loss_and_accuracy(model, train_set)["loss"] < before
    (record,) = history
    assert {"train_loss", "test_accuracy", "lr", "seconds"} <= set(record)
    entropy = record["attention_entropy"]
    assert list(entropy) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    assert all(0 < v <= 1 for v in entropy.values())
    assert not model.training


def test_same_seed_same_history():
    train_set, test_set = Shapes("train", n=96), Shapes("test", n=32)
    config = TrainConfig(epochs=2, batch_size=32, augment=True, threads=1)
    runs = [train(tiny_vit(), train_set, test_set, config, progress=False) for _ in range(2)]
    strip = [[{k: v for k, v in r.items() if k != "seconds"} for r in h] for h in runs]
    assert strip[0] == strip[1]


def test_thread_count_restored():
    before = torch.get_num_threads()
    train(
        tiny_vit(),
        Shapes("train", n=32),
        Shapes("test", n=16),
        TrainConfig(epochs=1, batch_size=16, threads=1),
        progress=False,
    )
    assert torch.get_num_threads() == before


def test_identity_talking_heads_starts_from_plain_multi_head_attention():
    from vizkit.train.inits import identity_talking_heads

    torch.manual_seed(0)
    kwargs = {"img_size": 32, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_classes": 10}
    model = timm.create_model("cait_xxs24_224", **kwargs)
    before = model.blocks[0].attn.proj_l.weight.clone()
    assert identity_talking_heads(model) == 2 * len(model.blocks)
    after = model.blocks[0].attn.proj_l.weight
    torch.testing.assert_close(after - before, torch.eye(len(after)))
    vit = timm.create_model("vit_tiny_patch16_224", **{**kwargs, "num_heads": 2})
    with pytest.raises(ValueError, match="no talking-heads attention"):
        identity_talking_heads(vit)


def test_recipe_init_names_are_validated(tmp_path):
    from vizkit.train.recipes import load_recipe

    spec = {**load_recipe("cait_tiny_shapes"), "init": ["orthogonal_everything"]}
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="unknown init.*identity_talking_heads"):
        load_recipe(file)


def test_mixup_and_cutmix_mix_images_and_weight_the_labels():
    from vizkit.train.mixing import mix_batch, mixed_cross_entropy

    images = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 3, 8, 8).clone()
    labels = torch.arange(4)
    g = torch.Generator().manual_seed(0)
    mixed, partners, lam = mix_batch(images, labels, mixup=0.8, cutmix=0.0, generator=g)
    torch.testing.assert_close(mixed[:, 0, 0, 0], lam * labels + (1 - lam) * partners.float())
    mixed, partners, lam = mix_batch(images, labels, mixup=0.0, cutmix=1.0, generator=g)
    kept = (mixed[:, 0] == images[:, 0]).float().mean((1, 2))  # share of own pixels
    moved = partners != labels
    torch.testing.assert_close(kept[moved], torch.full_like(kept[moved], lam))
    logits = torch.randn(4, 5)
    ce = torch.nn.functional.cross_entropy
    torch.testing.assert_close(
        mixed_cross_entropy(logits, labels, partners, 0.3, 0.0),
        0.3 * ce(logits, labels) + 0.7 * ce(logits, partners),
    )
