"""A damaged activation store (issue 69): a shard cut short or enlarged after a crash, a byte
changed, a manifest edited by hand or a marker damaged is refused when the store is opened (by
size) or verified (by SHA-1), naming the shard and the fix; the fix (the same
`cache_activations` again) rewrites the damaged shard and the store reads back bit for bit.
Before, a short shard made `rows` loop forever."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import warnings

import pytest
import timm
import torch

import vizkit as vk

ROW = 16 * 192 * 4  # one image's patches, float32
SHARD = 3 * ROW  # three images a shard: shards of 3, 3, 3 and 1 images


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                             num_classes=3).eval()  # fmt: skip


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def write(model, images, folder):
    return vk.cache_activations(model, images, folder, shard_bytes=SHARD, progress=False)


def cut(file, keep: int) -> None:
    data = file.read_bytes()
    file.write_bytes(data[:keep])


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: cut(f / "layer0" / "00001.bin", 1000),
         r"shard 1: layer0/00001.bin holds 1000 bytes where the manifest implies 36864"),
        (lambda f: (f / "layer0" / "00002.pos").write_bytes(b"\0" * 8000),
         r"shard 2: layer0/00002.pos holds 8000 bytes where the manifest implies 192"),
        (lambda f: (f / "layer0" / "00003.bin").unlink(), r"shard 3: layer0/00003.bin is missing"),
        (lambda f: (f / "shards" / "00000.json").write_text('{"shard": 0, "fil'),
         r"shard 0: its marker 00000.json is damaged"),
    ],
)  # fmt: skip
def test_a_damaged_shard_is_refused_and_the_resume_rewrites_it(tmp_path, images, damage,
                                                               message):  # fmt: skip
    model, folder = tiny(), tmp_path / "s"
    want = write(model, images, folder).rows(0, 160)
    damage(folder)
    with pytest.raises(ValueError, match=message + r".*Run vk.cache_activations again"):
        vk.store.ActivationStore(folder)
    with pytest.warns(UserWarning, match=r"shard \d is damaged .*writing it again"):
        store = write(model, images, folder)  # the fix the message gives
    assert torch.equal(store.rows(0, len(store)), want)


def test_a_changed_byte_is_found_by_verify_and_rewritten_on_resume(tmp_path, images):
    model, folder = tiny(), tmp_path / "s"
    want = write(model, images, folder).rows(0, 160)
    file = folder / "layer0" / "00002.bin"
    data = bytearray(file.read_bytes())
    data[100] ^= 0x01  # one bit: the size is right
    file.write_bytes(bytes(data))
    store = vk.store.ActivationStore(folder)  # opening checks sizes only
    with pytest.raises(ValueError, match=r"shard 2: layer0/00002.bin does not hold the bytes"):
        store.verify()
    with pytest.warns(UserWarning, match=r"shard 2 is damaged"):
        store = write(model, images, folder)
    store.verify()
    assert torch.equal(store.rows(0, len(store)), want)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"images": 12}, r"shard 3: .* where the manifest implies"),  # 3 images in the last
        ({"images": 9}, r"shard 3: it is beyond the 3 shards of the manifest's 9 images"),
        ({"images": 11}, r"shard 3: its marker holds images \[9, 10\] where the manifest "
                         r"implies \[9, 11\]"),
        ({"width": 96}, r"shard 0: layer0/00000.bin holds 36864 bytes where the manifest "
                        r"implies 18432"),
    ],
)  # fmt: skip
def test_a_manifest_edited_by_hand_is_refused_not_read_as_other_rows(tmp_path, images, edit,
                                                                    message):  # fmt: skip
    folder = tmp_path / "s"
    write(tiny(), images, folder)
    file = folder / "manifest.json"
    manifest = json.loads(file.read_text())
    if "width" in edit:
        manifest["layers"]["blocks.1.hook_resid_post"]["width"] = edit["width"]
    else:
        manifest["images"] = edit["images"]
    file.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=message):
        vk.store.ActivationStore(folder)


def test_a_store_of_old_markers_is_still_read(tmp_path, images):
    """Markers written before they recorded their files: sizes are still checked."""
    model, folder = tiny(), tmp_path / "s"
    want = write(model, images, folder).rows(0, 160)
    for marker in (folder / "shards").glob("*.json"):
        old = json.loads(marker.read_text())
        marker.write_text(json.dumps({"shard": old["shard"], "images": old["images"]}))
    store = vk.store.ActivationStore(folder)
    store.verify()
    assert torch.equal(store.rows(0, len(store)), want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing rewritten, nothing warned
        write(model, images, folder)


def test_rows_out_of_range_are_refused(tmp_path, images):
    store = write(tiny(), images, tmp_path / "s")
    with pytest.raises(IndexError, match="row 160 out of range for a store of 160 rows"):
        store.image_of(len(store))
    assert store.image_of(-1) == store.image_of(159)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda text: text[: len(text) // 2], r"manifest.json is damaged \(not JSON"),
        (lambda text: text.replace('"shard_images"', '"shard_imgs"'),
         r"damaged \(no shard_images\)"),
        (lambda text: text.replace('"dtype": "float32"', '"dtype": "float8"'),
         r"damaged or was edited \(dtype must be one of float32"),
        (lambda text: text.replace('"seed": 0', '"sed": 0'),
         r"missing: \['seed'\]; unknown: \['sed'\]"),
        (lambda text: text.replace('"width": 192', '"width": -192'), r"width must be an int >= 1"),
    ],
)  # fmt: skip
def test_a_damaged_manifest_is_refused_in_vizkits_words(tmp_path, images, damage, message):
    folder = tmp_path / "s"
    write(tiny(), images, folder)
    file = folder / "manifest.json"
    file.write_text(damage(file.read_text()))
    for open_it in (
        lambda: vk.store.ActivationStore(folder),
        lambda: write(tiny(), images, folder),
    ):
        with pytest.raises(ValueError, match=message):
            open_it()


def test_out_a_file_is_refused_and_a_missing_parent_made(tmp_path, images):
    (tmp_path / "file").write_text("notes")
    with pytest.raises(ValueError, match="is a file; a store is a folder"):
        write(tiny(), images, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "notes"
    assert len(write(tiny(), images[:2], tmp_path / "new" / "deeper" / "s")) == 32


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_mid_store_is_named_and_the_store_resumes(tmp_path, images, monkeypatch):
    """/dev/full fails every write with ENOSPC, as a disk that fills up mid-shard does."""
    from vizkit.store import writing

    model, folder = tiny(), tmp_path / "s"
    real, calls = writing.replaced_whole, {"n": 0}

    @contextlib.contextmanager
    def disk_fills_at_the_fifth_file(path):
        calls["n"] += 1
        if calls["n"] < 5:
            with real(path) as partial:
                yield partial
        else:
            yield pathlib.Path("/dev/full")

    monkeypatch.setattr(writing, "replaced_whole", disk_fills_at_the_fifth_file)
    with pytest.raises(OSError, match=r"Writing shard 2 of the store .* the disk is full .* "
                                      r"run the same call again to resume"):  # fmt: skip
        write(model, images, folder)
    monkeypatch.setattr(writing, "replaced_whole", real)
    want = write(model, images, tmp_path / "whole").rows(0, 160)
    assert torch.equal(write(model, images, folder).rows(0, 160), want)
