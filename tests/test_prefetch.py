"""vizkit.prefetch: the next batch is read by a thread, in order, errors where they belong;
only where the model computes on an accelerator."""

import threading
import time

import pytest
import timm
import torch

import vizkit as vk
import vizkit.prefetch
from vizkit.prefetch import prefetched, read_ahead


def test_items_come_in_order_read_by_the_thread():
    readers = []

    def items():
        for i in range(5):
            readers.append(threading.current_thread().name)
            yield i

    assert list(prefetched(items(), "reader")) == [0, 1, 2, 3, 4]
    assert set(readers) == {"reader"}


def test_an_error_is_raised_at_the_item_it_concerns():
    def items():
        yield 0
        yield 1
        raise OSError("item 2 is unreadable")

    got = []
    with pytest.raises(OSError, match="item 2 is unreadable"):
        for item in prefetched(items()):
            got.append(item)
    assert got == [0, 1]


def test_closing_the_generator_stops_the_thread():
    def endless():
        i = 0
        while True:
            yield i
            i += 1

    items = prefetched(endless(), "endless-reader")
    assert next(items) == 0
    items.close()
    deadline = time.monotonic() + 5
    while any(t.name == "endless-reader" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the reading thread outlived its consumer"
        time.sleep(0.05)


def test_items_are_read_ahead_only_for_a_model_on_an_accelerator(monkeypatch):
    readers = []

    def items():
        for i in range(3):
            readers.append(threading.current_thread().name)
            yield i

    for model in (torch.nn.Linear(2, 2), torch.nn.ReLU()):  # on the CPU, or no parameters
        readers.clear()
        assert list(read_ahead(items(), model, "reader")) == [0, 1, 2]
        assert set(readers) == {"MainThread"}  # no thread beside the model's
    readers.clear()
    assert list(read_ahead(items(), torch.nn.Linear(2, 2, device="meta"), "reader")) == [0, 1, 2]
    assert set(readers) == {"reader"}  # a model elsewhere than the CPU
    monkeypatch.setattr(vizkit.prefetch, "model_device", lambda model: torch.device("cuda"))
    readers.clear()
    assert list(read_ahead(items(), model, "reader")) == [0, 1, 2]
    assert set(readers) == {"reader"}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_cka_reads_the_next_batch_during_this_one_on_an_accelerator(device, monkeypatch):
    monkeypatch.setattr(vizkit.prefetch, "model_device", lambda model: torch.device(device))
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8,
                              depth=3, num_classes=0).eval()  # fmt: skip
    x = torch.randn(24, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    readers = []

    class Recorded(torch.utils.data.Dataset):
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            readers.append(threading.current_thread().name)
            return x[i], 0

    loader = torch.utils.data.DataLoader(Recorded(), batch_size=8)
    from_loader = vk.cka_matrix(model, loader, progress=False).matrix
    from_tensor = vk.cka_matrix(model, x, batch_size=8, progress=False).matrix
    assert set(readers) == {"vizkit-cka-prefetch" if device == "cuda" else "MainThread"}
    torch.testing.assert_close(from_loader, from_tensor, rtol=0, atol=0)
