"""Sweeps: several recipes side by side (`vizkit train A B --jobs 2`), each run in its own
process writing whole files; everything checked before the first run starts."""

import contextlib
import io
import json
import re

import pytest

from vizkit import zoo
from vizkit.cli import main
from vizkit.train.recipes import run_recipe
from vizkit.train.sweep import run_recipes

TINY = {
    "architecture": "vit_tiny_patch16_224",
    "kwargs": {
        "img_size": 32,
        "patch_size": 8,
        "embed_dim": 16,
        "depth": 1,
        "num_heads": 2,
        "num_classes": 10,
    },
    "data": "digits",
    "train": {"epochs": 1, "batch_size": 128, "seed": 0, "flip": False, "threads": 1},
    "track": ["attention_entropy"],
}


def _recipes(folder, *names, **changes):
    paths = []
    for name in names:
        path = folder / f"{name}.json"
        path.write_text(json.dumps({**TINY, "name": name, **changes.get(name, {})}))
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """Two seeds side by side through the command line, and seed 1 again in this process."""
    recipes, models = tmp_path_factory.mktemp("recipes"), tmp_path_factory.mktemp("zoo")
    seed1 = {"train": {**TINY["train"], "seed": 1}}
    paths = _recipes(recipes, "tiny_s0", "tiny_s1", tiny_s1=seed1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VIZKIT_MODELS", str(models))
        again = run_recipe(paths[1], out_dir=tmp_path_factory.mktemp("alone"), progress=False)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            status = main(["train", *map(str, paths), "--jobs", "2"])
    return models, status, printed.getvalue(), again


def test_runs_side_by_side_train_what_one_run_alone_trains(swept):
    models, status, printed, alone = swept
    assert status == 0
    assert sorted(p.name for p in models.iterdir()) == [
        "README.md", "tiny_s0.json", "tiny_s0.safetensors", "tiny_s1.json", "tiny_s1.safetensors"
    ]  # fmt: skip
    side_by_side = json.loads((models / "tiny_s1.json").read_text())
    assert side_by_side["sha256"] == alone["sha256"]  # the same weights, bit for bit
    untimed = [{k: v for k, v in e.items() if k != "seconds"} for e in alone["history"]]
    assert [{k: v for k, v in e.items() if k != "seconds"} for e in side_by_side["history"]] == (
        untimed
    )
    s0 = json.loads((models / "tiny_s0.json").read_text())
    assert s0["sha256"] != side_by_side["sha256"] and s0["recipe"]["seed"] == 0


def test_each_finished_run_prints_its_headline(swept):
    _, _, printed, _ = swept
    lines = sorted(printed.strip().splitlines())
    assert [line.split(":")[0] for line in lines] == ["tiny_s0", "tiny_s1"]
    assert all("test accuracy 0." in line for line in lines)


def test_the_readme_lists_every_model_of_the_sweep(swept, monkeypatch):
    models = swept[0]
    monkeypatch.setenv("VIZKIT_MODELS", str(models))
    readme = (models / "README.md").read_text()
    assert all(f"| {name} |" in readme for name in zoo.list_models() if name.startswith("tiny_"))
    assert "| tiny_s0 |" in readme and "| tiny_s1 |" in readme


def test_a_failed_run_is_named_after_the_others_finish(tmp_path):
    broken = {"kwargs": {**TINY["kwargs"], "no_such_argument": 1}}
    paths = _recipes(tmp_path, "good", "broken", broken=broken)
    out = tmp_path / "zoo"
    with pytest.raises(RuntimeError, match=r"1 of 2 runs failed .*broken\.json: TypeError"):
        run_recipes(paths, jobs=2, out_dir=out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "good.json", "good.safetensors"]


def test_mistakes_are_refused_before_any_run_starts(tmp_path):
    paths = _recipes(tmp_path, "a", "b")
    out = tmp_path / "zoo"
    with pytest.raises(ValueError, match=r"Recipes \['a'\] are given twice"):
        run_recipes([paths[0], paths[1], paths[0]], jobs=2, out_dir=out)
    out.mkdir()
    (out / "b.json").write_text("{}")
    with pytest.raises(FileExistsError, match=r"b\.json exists: training b would overwrite it"):
        run_recipes(paths, jobs=2, out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == ["b.json"]  # nothing trained
    with pytest.raises(ValueError, match="jobs must be a whole number >= 1"):
        run_recipes(paths, jobs=0, out_dir=out, overwrite=True)
    with pytest.raises(ValueError, match="No recipes given"):
        run_recipes([], out_dir=out)


def test_no_run_starts_after_the_deadline_and_the_rest_are_named(tmp_path):
    paths = _recipes(tmp_path, "late", "later")
    for jobs in (1, 2):
        with pytest.warns(UserWarning, match=r"2 runs not started \(late, later\);.*skip-trained"):
            assert run_recipes(paths, jobs=jobs, out_dir=tmp_path / "zoo", stop_after=0) == []
    assert not (tmp_path / "zoo").exists()


def test_a_stopped_sweep_resumes_with_skip_trained(tmp_path):
    paths = _recipes(tmp_path, "first", "second")
    out = tmp_path / "zoo"
    run_recipe(paths[0], out_dir=out, progress=False)
    before = (out / "first.safetensors").stat().st_mtime_ns
    cards = run_recipes(paths, out_dir=out, skip_trained=True, progress=False)
    assert [c["name"] for c in cards] == ["second"]
    assert (out / "first.safetensors").stat().st_mtime_ns == before  # left alone
    assert run_recipes(paths, out_dir=out, skip_trained=True) == []  # nothing left to train
    with pytest.raises(ValueError, match="pass one of them"):
        run_recipes(paths, out_dir=out, skip_trained=True, overwrite=True)
    (out / "second.json").unlink()  # a checkpoint without its card is no trained model
    with pytest.raises(FileExistsError, match=r"second\.safetensors exists"):
        run_recipes(paths, out_dir=out, skip_trained=True)


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--jobs", "0"], "argument --jobs: must be a whole number >= 1"),
        (["--stop-after", "-1"], "argument --stop-after: must be a number of minutes >= 0"),
        (["--stop-after", "soon"], "argument --stop-after: must be a number of minutes >= 0"),
    ],
)
def test_bad_sweep_options_are_one_line(args, phrase, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "vit_tiny_shapes", *args])
    assert exit_.value.code == 2 and phrase in capsys.readouterr().err


@pytest.fixture
def fake_runs(tmp_path, monkeypatch):
    """Recipes whose runs are `sweep_workers.fake_run` (no training) in the spawned workers."""
    import sweep_workers

    from vizkit.train import sweep

    monkeypatch.setattr(sweep, "run_recipe", sweep_workers.fake_run)
    return lambda *names: _recipes(tmp_path, *names)


def test_a_dead_worker_fails_its_runs_by_name_and_a_fresh_pool_takes_the_rest(fake_runs, tmp_path):
    names = ["a_die", "b_fine", "c_fine", "d_fine", "e_fine"]
    reported = []
    with pytest.warns(UserWarning, match="a_die.json failed: RuntimeError: a worker process died"):
        with pytest.raises(RuntimeError, match=r"of 5 runs failed") as failure:
            run_recipes(fake_runs(*names), jobs=2, out_dir=tmp_path / "zoo", progress=False,
                        report=lambda card: reported.append(card["name"]))  # fmt: skip
    failed = re.findall(r"(\w+)\.json: RuntimeError", str(failure.value))
    assert "a_die" in failed and "e_fine" in reported  # e started after the pool broke
    assert sorted(failed + reported) == names


def test_an_interrupt_stops_the_workers_at_once(fake_runs, tmp_path):
    import multiprocessing
    import os
    import signal
    import threading
    import time

    paths = fake_runs("a_slow", "b_slow")
    # Ctrl-C reaching this process only (as Jupyter's "interrupt kernel"), once the runs started;
    # Python's own handler, whatever an earlier test left installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(8.0, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            run_recipes(paths, jobs=2, out_dir=tmp_path / "zoo", progress=False)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 30  # the runs sleep 60 s: not waited for
    while multiprocessing.active_children() and time.monotonic() - start < 30:
        time.sleep(0.1)  # the executor's own thread may be reaping them too
    assert multiprocessing.active_children() == []
