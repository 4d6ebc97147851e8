"""vk.evaluate over a data set: the per-image scores are the metrics' own, a run killed at any
point resumes from its file to the same table with nothing counted twice, and a file of
another configuration is refused; `vizkit evaluate` on the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import timm
import torch
from torch.utils.data import TensorDataset

import vizkit as vk
from vizkit.cli import main

METRICS = ["deletion_auc", "sparseness", "pointing_game"]


@pytest.fixture(scope="module")
def shapes():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    x, labels, masks = vk.datasets.load_sample()
    return model, TensorDataset(x[:20], labels[:20], masks[:20])


def _attnlrp(model, x, targets):
    return vk.attnlrp(model, x, target=targets)


def test_scores_are_the_metrics_own_per_image(shapes):
    model, data = shapes
    table = vk.evaluate(model, data, methods=[("lrp", _attnlrp), "random"], metrics=METRICS,
                        batch_size=8, progress=False)  # fmt: skip
    x, labels, masks = data.tensors
    maps = vk.attnlrp(model, x, target=labels).maps
    assert table.per_image.shape == (2, 3, 20)
    torch.testing.assert_close(table.per_image[0, 1], vk.metrics.sparseness(maps).float())
    torch.testing.assert_close(table.per_image[0, 2], vk.metrics.pointing_game(maps, masks))
    first = vk.metrics.deletion(model, x[:8], maps[:8], labels[:8], progress=False).auc
    torch.testing.assert_close(table.per_image[0, 0, :8], first)
    values = table.per_image[1, 1].double()
    torch.testing.assert_close(table.mean[1, 1].double(), values.mean(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(table.sem[1, 1].double(), values.std() / 20**0.5, rtol=1e-5,
                               atol=1e-7)  # fmt: skip
    assert table.best("pointing_game") == "lrp" and "± " in table.to_markdown()


def test_a_killed_run_resumes_to_the_same_table(shapes, tmp_path):
    model, data = shapes
    reference = vk.evaluate(model, data, methods=[("lrp", _attnlrp), "random"],
                            metrics=METRICS, batch_size=8, progress=False)  # fmt: skip
    calls = []

    def killed(model, x, targets):  # the process dies on the method's second batch
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return _attnlrp(model, x, targets)

    out = tmp_path / "eval.jsonl"
    with pytest.raises(KeyboardInterrupt):
        vk.evaluate(model, data, methods=[("lrp", killed), "random"], metrics=METRICS,
                    batch_size=8, out=out, progress=False)  # fmt: skip
    done = len(out.read_text().splitlines())  # the header and batch 0 of both methods
    with out.open("a") as file:
        file.write('{"batch": 1, "method": "ran')  # a line cut short by the kill
    resumed = vk.evaluate(model, data, methods=[("lrp", _attnlrp), "random"], metrics=METRICS,
                          batch_size=8, out=out, progress=False)  # fmt: skip
    torch.testing.assert_close(resumed.per_image, reference.per_image, equal_nan=True)
    entries = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [(e["batch"], e["method"]) for e in entries[1:]]
    assert len(keys) == len(set(keys)) == 3 * 2 and done == 3
    again = vk.evaluate(model, data, methods=[("lrp", killed), "random"], metrics=METRICS,
                        batch_size=8, out=out, progress=False)  # fmt: skip
    torch.testing.assert_close(again.per_image, reference.per_image, equal_nan=True)
    with pytest.raises(ValueError, match=r"other evaluation settings \(methods differ\)"):
        vk.evaluate(model, data, methods=["random"], metrics=METRICS, batch_size=8, out=out)


def test_a_resumed_progress_bar_starts_at_the_done_count(shapes, tmp_path, monkeypatch):
    evaluate_module = sys.modules["vizkit.metrics.evaluate"]  # the name is the function's
    bars = []

    class Recorded(evaluate_module.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.opened_at = self.n
            bars.append(self)

    monkeypatch.setattr(evaluate_module, "tqdm", Recorded)
    model, data = shapes
    calls = []

    def interrupted(model, x, targets):  # Ctrl-C on the third batch
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return vk.random_saliency(model, x, target=targets)

    run = {"metrics": ["sparseness"], "batch_size": 8, "out": tmp_path / "eval.jsonl"}
    with pytest.raises(KeyboardInterrupt):
        vk.evaluate(model, data, methods=[("m", interrupted)], **run)
    vk.evaluate(model, data, methods=[("m", interrupted)], **run)
    assert (bars[0].opened_at, bars[0].n, bars[0].total) == (0, 2, 3)  # interrupted
    assert (bars[1].opened_at, bars[1].n, bars[1].total) == (2, 3, 3)  # resumed
    assert "2/3" in bars[1].format_meter(2, 3, 0)  # what the bar showed on opening


def test_evaluate_refuses_bad_arguments(shapes):
    model, data = shapes
    x, labels, _ = data.tensors
    with pytest.raises(KeyError, match="Unknown metrics"):
        vk.evaluate(model, data, methods=["random"], metrics=["accuracy"])
    with pytest.raises(ValueError, match="need object masks"):
        vk.evaluate(model, (x, labels), methods=["random"], metrics=["pointing_game"])
    with pytest.raises(ValueError, match="targets"):
        vk.evaluate(model, data, methods=["random"], targets="truth")


def test_vizkit_evaluate_resumes_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "shapes.jsonl"
    args = ["evaluate", "--methods", "random", "gradcam", "--metrics", "sparseness",
            "complexity", "--limit", "12", "--batch-size", "6", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "| random |" in first and "sparseness" in first
    lines = out.read_text().splitlines()
    assert main(args) == 0  # everything is in the file: nothing recomputed
    assert capsys.readouterr().out == first and out.read_text().splitlines() == lines


@pytest.mark.slow
def test_two_gloo_processes_give_the_single_process_table(tmp_path, capsys):
    """torchrun with two processes: each takes every other batch and appends to its own
    shard file; the table printed is the one a single process prints (but for the seconds
    each method took: wall time)."""
    out = tmp_path / "shapes.jsonl"
    args = ["evaluate", "--methods", "attnlrp", "random", "--metrics", "sparseness",
            "deletion_auc", "--limit", "16", "--batch-size", "4"]  # fmt: skip
    assert main(args) == 0
    single = capsys.readouterr().out
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "-m", "vizkit.cli", *args, "--out", str(out)]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # gloo on CPU even where a GPU exists
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _without_seconds(run.stdout) == _without_seconds(single)
    shards = sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".lock")
    assert shards == ["shapes.jsonl.rank0-of-2", "shapes.jsonl.rank1-of-2"]
    assert (tmp_path / "shapes.jsonl.rank1-of-2.lock").exists()  # each shard's writer lock
    batches = {json.loads(line)["batch"] for line in
               (tmp_path / shards[1]).read_text().splitlines()[1:]}  # fmt: skip
    assert batches == {1, 3}


def test_evaluation_figures_come_from_the_table_and_curves(shapes):
    model, data = shapes
    x, labels, _ = data.tensors
    table = vk.evaluate(model, data, methods=[("lrp", _attnlrp), "random"], metrics=METRICS,
                        batch_size=10, progress=False)  # fmt: skip
    bars = vk.viz.evaluation_bars(table)
    titles = [a.text for a in bars.layout.annotations]
    assert titles[0] == "deletion_auc ↓<br>best: lrp" and len(bars.data) == len(METRICS)
    assert list(bars.data[1].y) == pytest.approx(table.mean[:, 1].tolist())
    maps = {"lrp": vk.attnlrp(model, x[:6], target=labels[:6]), "random": torch.rand(6, 32, 32)}
    curves = {name: vk.metrics.road(model, x[:6], m, labels[:6]) for name, m in maps.items()}
    figure = vk.viz.curve_comparison(curves)
    names = [t.name for t in figure.data if t.showlegend is not False]
    assert names[0].startswith("lrp (area ") and "ROAD MoRF" in figure.layout.title.text
    both = vk.viz.curve_comparison(
        {name: [curves[name], vk.metrics.road(model, x[:6], m, labels[:6], order="lerf")]
         for name, m in maps.items()}
    )  # fmt: skip
    assert [a.text for a in both.layout.annotations][1].startswith("ROAD LeRF")
    assert len([t for t in both.data if t.showlegend is not False]) == 2  # a legend entry each
    with pytest.raises(ValueError, match="same kinds"):
        vk.viz.curve_comparison(
            {
                **curves,
                "del": vk.metrics.deletion(
                    model, x[:6], torch.rand(6, 32, 32), labels[:6], progress=False
                ),
            }
        )


def test_labels_are_checked_before_a_batch_is_scored():
    """A label outside the model's classes, a float label, one-hot labels and data without
    labels are refused naming the image and the fix, never a batch of NaN or a truncated
    class; the table's caption counts the images it averages; best() of an empty column
    refuses."""
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32,
                              patch_size=8, depth=1).eval()  # fmt: skip
    x = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    run = {"methods": ["random"], "metrics": ["sparseness"], "batch_size": 4, "progress": False}
    labels, calls = torch.tensor([1, 2, 3, 4, 5, 10]), []
    with pytest.raises(ValueError, match=r"Label 10 of image 5 is not a class.*0\.\.9"):
        vk.evaluate(model, (x, labels), **{**run, "methods": [("m", lambda *a: calls.append(a))]})
    assert calls == []  # refused before the first batch was explained
    fractional = torch.tensor([1.0, 2.0, 3.0, 2.7, 5.0, 6.0])
    with pytest.raises(
        ValueError, match=r"integer class indices; got torch.float32 \(image 3: 2.7"
    ):
        vk.evaluate(model, (x, fractional), **run)
    with pytest.raises(ValueError, match=r"pass labels\.argmax\(1\)"):
        vk.evaluate(model, (x, torch.eye(10)[:6]), **run)
    with pytest.raises(ValueError, match="targets='predictions'"):
        vk.evaluate(model, torch.utils.data.TensorDataset(x), **run)
    table = vk.evaluate(model, (x, labels.clamp(max=9)), **run)
    assert "over 6 images" in table._repr_html_()
    subset = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, labels),
                                         batch_size=4, sampler=[0, 1, 2, 3])  # fmt: skip
    vk.evaluate(model, subset, **run)  # label 10 of image 5 is never read: no refusal
    table.per_image[:, :, 4:] = float("nan")
    assert "over 4 of 6 images" in table._repr_html_()
    table.per_image[:] = float("nan")
    with pytest.raises(ValueError, match="No method has a sparseness score"):
        table.best("sparseness")


def test_mistakes_at_data_set_scale_say_what_was_wrong_and_the_fix(tmp_path):
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32,
                              patch_size=8, depth=1).eval()  # fmt: skip
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([1, 2, 3, 4])
    table = vk.evaluate(model, (x, labels), methods="random", metrics="sparseness",
                        progress=False)  # fmt: skip
    assert table.methods == ["random"] and table.metrics == ["sparseness"]  # one name each

    class Dicts(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"pixel_values": x[i], "label": labels[i]}

    with pytest.raises(TypeError, match=r"yields dicts \(keys pixel_values, label\)"):
        vk.evaluate(model, Dicts(), methods=["random"], progress=False)
    with pytest.raises(ValueError, match=r"masks of images 0\.\. are \(4, 30, 30\)"):
        vk.evaluate(model, (x, labels, torch.ones(4, 30, 30, dtype=torch.bool)),
                    methods=["random"], progress=False)  # fmt: skip
    broken = x.repeat(2, 1, 1, 1)
    broken[5, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"Images \[5\] of the data hold NaN"):
        vk.evaluate(model, (broken, labels.repeat(2)), methods=["random"], batch_size=4,
                    progress=False)  # fmt: skip
    out = tmp_path / "log.jsonl"
    (tmp_path / "log.jsonl.rank0-of-2").write_text("")
    with pytest.raises(ValueError, match=r"run of 2 process\(es\) and this one has 1"):
        vk.evaluate(model, (x, labels), methods=["random"], out=out, progress=False)
    patched = vk.activation_patching(model, x[:2], x[2:], sites="attn", progress=False)
    assert patched.attn is not None and patched.resid is None
    with pytest.raises(ValueError, match=r"versus is the target class for images \[0, 1\]"):
        vk.activation_patching(model, x[:2], x[2:], target=3, versus=3, progress=False)
    with pytest.raises(ValueError, match="versus is the target class"):
        vk.direct_logit_attribution(model, x[:2], target=3, versus=3)
    lens = vk.logit_lens(model, x[:2])
    for wrong in (10, 2.5):
        with pytest.raises((ValueError, TypeError), match="(?i)target"):
            lens.maps(wrong)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_next_batch_loads_while_this_one_is_explained_on_an_accelerator(device, monkeypatch):
    """On an accelerator, batches after the first are read by a prefetching thread (on the
    CPU, by the calling thread); an error while reading is raised at the batch it concerns,
    after the batches before it were scored."""
    import threading

    import vizkit.prefetch

    monkeypatch.setattr(vizkit.prefetch, "model_device", lambda model: torch.device(device))
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32,
                              patch_size=8, depth=1).eval()  # fmt: skip
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    readers, scored = [], []

    class Recorded(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            readers.append(threading.current_thread().name)
            if i == 6 and self.broken:
                raise OSError("image 6 is unreadable")
            return x[i], 1

    def method(model, images, targets):
        scored.append(len(images))
        return vk.random_saliency(model, images, target=targets)

    data = Recorded()
    data.broken = False
    run = {"methods": [("m", method)], "metrics": ["sparseness"], "batch_size": 2}
    vk.evaluate(model, data, progress=False, **run)
    assert readers[:2] == ["MainThread"] * 2  # the first batch, read to check the data
    reader = "vizkit-evaluate-prefetch" if device == "cuda" else "MainThread"
    assert set(readers[2:]) == {reader}
    data.broken, scored[:] = True, []
    with pytest.raises(OSError, match="image 6 is unreadable"):
        vk.evaluate(model, data, progress=False, **run)
    assert scored == [2, 2, 2]  # batches 0-2 were explained


def _without_seconds(table: str) -> str:
    """A printed `SaliencyTable` without its last column (each method's seconds)."""
    return "\n".join(
        line.rstrip("|").rsplit("|", 1)[0] if line.startswith("|") else line
        for line in table.splitlines()
    )
