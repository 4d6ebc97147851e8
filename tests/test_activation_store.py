"""The activation store: what it writes equals the activations `run_with_cache` returns, row
for row; token choices, dtypes, shards, resuming, torchrun and refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import timm
import torch
from guide_example import run_first_example
from torch.utils.data import DataLoader, TensorDataset

import vizkit as vk
from vizkit.store import writing

LAYERS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]


def tiny(reg_tokens: int = 0, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=3,
        reg_tokens=reg_tokens, no_embed_class=reg_tokens > 0,
    ).eval()  # fmt: skip


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def expected(model, images, layer: str) -> torch.Tensor:
    _, cache = vk.HookedModel(model).run_with_cache(images, names=layer)
    return cache[layer]  # (B, N, C)


def test_rows_are_the_activations_token_by_token(tmp_path, images):
    model = tiny()
    store = vk.cache_activations(model, images, tmp_path / "s", layers=[0, 1], tokens="all",
                                 batch_size=4, progress=False)  # fmt: skip
    assert store.name == LAYERS[0] and store.tokens_per_image == 17 and len(store) == 170
    for layer in LAYERS:
        ours = store.layer(layer)
        want = expected(model, images, layer).flatten(0, 1)
        torch.testing.assert_close(ours.rows(0, len(ours)), want, rtol=0, atol=0)
        torch.testing.assert_close(torch.stack([ours[i] for i in (0, 16, 169)]), want[[0, 16, 169]])
        assert torch.equal(torch.cat(list(ours.batches(64))), want)
        assert torch.equal(ours.positions(), torch.arange(17).expand(10, -1))
    assert store.image_of(35) == (2, 1)
    assert "blocks.0.hook_resid_post: 10 images x 17 tokens x 192" in repr(store)


@pytest.mark.parametrize("tokens, count", [("patches", 16), ("class", 1)])
def test_named_token_choices(tmp_path, images, tokens, count):
    model = tiny()
    store = vk.cache_activations(model, images, tmp_path / "s", tokens=tokens, progress=False)
    want = expected(model, images, LAYERS[-1])
    kept = want[:, 1:] if tokens == "patches" else want[:, :1]
    assert store.name == LAYERS[-1] and store.tokens_per_image == count  # default: last block
    torch.testing.assert_close(store.rows(0, len(store)), kept.flatten(0, 1), rtol=0, atol=0)


def test_registers_and_random_patches(tmp_path, images):
    model = tiny(reg_tokens=2)
    registers = vk.cache_activations(model, images, tmp_path / "r", tokens="registers",
                                     progress=False)  # fmt: skip
    want = expected(model, images, LAYERS[-1])
    assert torch.equal(registers.positions()[0], torch.tensor([1, 2]))
    torch.testing.assert_close(registers.rows(0, 20), want[:, 1:3].flatten(0, 1), rtol=0, atol=0)
    drawn = vk.cache_activations(model, images, tmp_path / "k", tokens=5, seed=7, progress=False)
    positions = drawn.positions()
    assert positions.shape == (10, 5) and (positions >= 3).all() and (positions < 19).all()
    assert (positions.diff(dim=1) > 0).all() and len({tuple(p.tolist()) for p in positions}) > 1
    rows = drawn.rows(0, len(drawn)).view(10, 5, -1)
    torch.testing.assert_close(rows, want.gather(1, positions[..., None].expand(-1, -1, 192)))
    again = vk.cache_activations(model, images, tmp_path / "k2", tokens=5, seed=7, progress=False)
    assert torch.equal(again.positions(), positions)  # drawn from the seed and the image index


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_are_the_cast_activations(tmp_path, images, dtype):
    model = tiny()
    store = vk.cache_activations(model, images, tmp_path / "s", dtype=dtype, progress=False)
    assert store.dtype == dtype and store[0].dtype == dtype
    want = expected(model, images, LAYERS[-1])[:, 1:].flatten(0, 1).to(dtype)
    assert torch.equal(store.rows(0, len(store)), want)


def test_shards_follow_the_byte_budget(tmp_path, images):
    model = tiny()
    row = 16 * 192 * 4  # one image: 16 patches x 192 floats
    store = vk.cache_activations(model, images, tmp_path / "s", shard_bytes=3 * row,
                                 progress=False)  # fmt: skip
    assert store.manifest["shard_images"] == 3
    assert sorted(p.name for p in (tmp_path / "s" / "layer0").glob("*.bin")) == [
        "00000.bin", "00001.bin", "00002.bin", "00003.bin"]  # fmt: skip
    want = expected(model, images, LAYERS[-1])[:, 1:].flatten(0, 1)
    assert torch.equal(store.rows(40, 120), want[40:120])  # across shard boundaries
    assert torch.equal(store[-1], want[-1])


def test_a_killed_run_resumes_without_rewriting_finished_shards(tmp_path, images, monkeypatch):
    model, folder, row = tiny(), tmp_path / "s", 16 * 192 * 4
    real = writing._write_shard

    def dies_at_shard_2(hm, data, shard, *args):
        if shard == 2:
            raise KeyboardInterrupt
        real(hm, data, shard, *args)

    monkeypatch.setattr(writing, "_write_shard", dies_at_shard_2)
    with pytest.raises(KeyboardInterrupt):
        vk.cache_activations(model, images, folder, shard_bytes=3 * row, progress=False)
    with pytest.raises(ValueError, match=r"incomplete: shards \[2, 3\] of 4"):
        vk.store.ActivationStore(folder)
    written = (folder / "layer0" / "00000.bin").stat().st_mtime_ns
    monkeypatch.setattr(writing, "_write_shard", real)
    calls = []
    monkeypatch.setattr(
        writing, "_write_shard", lambda hm, d, s, *a: (calls.append(s), real(hm, d, s, *a))
    )
    store = vk.cache_activations(model, images, folder, shard_bytes=3 * row, progress=False)
    assert calls == [2, 3]
    assert (folder / "layer0" / "00000.bin").stat().st_mtime_ns == written
    want = expected(model, images, LAYERS[-1])[:, 1:].flatten(0, 1)
    assert torch.equal(store.rows(0, len(store)), want)


def test_a_store_of_other_settings_or_weights_is_refused(tmp_path, images):
    model, folder = tiny(), tmp_path / "s"
    store = vk.cache_activations(model, images, folder, progress=False)
    with pytest.raises(ValueError, match=r'tokens: "patches" -> "all"'):
        vk.cache_activations(model, images, folder, tokens="all", progress=False)
    other = tiny(seed=1)
    with pytest.raises(ValueError, match=r"model\.fingerprint: "):
        vk.cache_activations(other, images, folder, progress=False)
    with pytest.raises(ValueError, match=r"data\.sampled\.9: "):
        vk.cache_activations(model, images.flip(0), folder, progress=False)
    store.check(model)  # the same weights: accepted
    store.check(model, tokens="patches", dtype="float32")
    with pytest.raises(ValueError, match=r"model\.fingerprint: .*vk\.cache_activations"):
        store.check(other)
    with pytest.raises(ValueError, match=r'dtype: "float32" -> "float16"'):
        store.check(model, dtype="float16")


def test_bad_arguments_are_refused(tmp_path, images):
    model = tiny()
    cases = [
        (dict(tokens=0), ValueError, "k must be >= 1"),
        (dict(tokens="cls"), ValueError, "tokens must be one of all, patches, class, registers"),
        (dict(tokens="registers"), ValueError, "has no register tokens"),
        (dict(tokens=17), ValueError, "17 random patches per image, but"),
        (dict(dtype=torch.int8), TypeError, "dtype must be torch.float32"),
        (dict(layers=5), (ValueError, IndexError), "5"),
    ]
    for i, (options, error, message) in enumerate(cases):
        with pytest.raises(error, match=message):
            vk.cache_activations(model, images, tmp_path / str(i), progress=False, **options)
    shuffled = DataLoader(TensorDataset(images), batch_size=4, shuffle=True)
    with pytest.raises(ValueError, match="does not read its dataset in order"):
        vk.cache_activations(model, shuffled, tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="data is empty"):
        vk.cache_activations(model, images[:0], tmp_path / "y", progress=False)
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not an activation store"):
        vk.cache_activations(model, images, tmp_path / "z", progress=False)
    with pytest.raises(FileNotFoundError, match="No activation store"):
        vk.store.ActivationStore(tmp_path / "z")


def test_a_dataloader_of_labelled_images_is_read_in_order(tmp_path, images):
    model = tiny()
    loader = DataLoader(TensorDataset(images, torch.arange(10)), batch_size=3)
    store = vk.cache_activations(model, loader, tmp_path / "s", progress=False)
    want = expected(model, images, LAYERS[-1])[:, 1:].flatten(0, 1)
    assert torch.equal(store.rows(0, len(store)), want)


@pytest.mark.slow
def test_two_torchrun_processes_write_the_single_process_store(tmp_path, images):
    torch.save({"images": images, "model": tiny().state_dict()}, tmp_path / "inputs.pt")
    script = tmp_path / "write.py"
    script.write_text(
        textwrap.dedent(f"""
        import timm, torch, torch.distributed as dist
        import vizkit as vk
        dist.init_process_group("gloo")
        inputs = torch.load({str(tmp_path / "inputs.pt")!r})
        model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                                  num_classes=3).eval()
        model.load_state_dict(inputs["model"])
        vk.cache_activations(model, inputs["images"], {str(tmp_path / "two")!r},
                             shard_bytes=3 * 16 * 192 * 4, progress=False)
        dist.destroy_process_group()
    """)
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               str(script)]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    single = vk.cache_activations(tiny(), images, tmp_path / "one", shard_bytes=3 * 16 * 192 * 4,
                                  progress=False)  # fmt: skip
    two = vk.store.ActivationStore(tmp_path / "two")
    assert two.manifest == single.manifest
    for shard in range(4):
        a, b = (np.fromfile(tmp_path / f / "layer0" / f"{shard:05d}.bin", np.float32)
                for f in ("one", "two"))  # fmt: skip
        assert np.array_equal(a, b)


def test_the_guide_runs_and_prints_what_it_says(tmp_path, monkeypatch):
    """docs/guide/activation-store.md: its example runs and prints what its comments say."""
    monkeypatch.chdir(tmp_path)
    printed, comments = run_first_example("activation-store.md")
    said = [comment.split(":", 1)[0] for comment in comments]
    assert printed[0].startswith(said[0]) and printed[0].endswith("64 tokens x 128, float32)")
    assert printed[1] == said[1]


def test_any_token_activation_by_name_and_others_refused(tmp_path, images):
    model = tiny()
    store = vk.cache_activations(model, images, tmp_path / "s", layers="blocks.0.mlp.fc1.hook_out",
                                 progress=False)  # fmt: skip
    assert store.width == 768
    want = expected(model, images, "blocks.0.mlp.fc1.hook_out")[:, 1:].flatten(0, 1)
    assert torch.equal(store.rows(0, len(store)), want)
    for i, name in enumerate(["blocks.0.attn.hook_pattern", "head.hook_out"]):
        with pytest.raises(ValueError, match=f"{name} is .*not tokens"):
            vk.cache_activations(model, images, tmp_path / str(i), layers=name, progress=False)


def test_a_backbone_without_logits_is_stored(tmp_path, images):
    torch.manual_seed(0)
    backbone = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                                 num_classes=0).eval()  # fmt: skip
    store = vk.cache_activations(backbone, images, tmp_path / "s", tokens="class", progress=False)
    want = expected(backbone, images, LAYERS[-1])[:, 0]
    assert torch.equal(store.rows(0, len(store)), want)
