"""Several recipes trained side by side (`vizkit train A B C --jobs N`): one process per run,
so a seed or budget sweep on a machine with cores (or a GPU) to spare extends the zoo in one
call. Every recipe is checked before the first run starts; each run writes its checkpoint and
card whole (`run_recipe` replaces the files atomically), so a stopped sweep leaves only
complete models and a rerun trains what is missing.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import zoo
from .recipes import load_recipe, refuse_to_overwrite, run_recipe, trained, write_models_readme

__all__ = ["run_recipes"]


def run_recipes(
    recipes: Sequence[str | Path],
    jobs: int = 1,
    out_dir: Path | None = None,
    epochs: int | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    stop_after: float | None = None,
    skip_trained: bool = False,
    progress: bool = True,
    report: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Train ``recipes`` in order, ``jobs`` at a time (each in its own process; ``jobs=1``
    trains here, with the per-epoch progress bar). ``stop_after`` (seconds) starts no run
    after that time; runs under way finish (the rest are named in a warning).
    ``skip_trained`` leaves out the recipes whose models ``out_dir`` has (a stopped sweep
    resumes). ``report`` is called with each card as its run ends. Returns the cards of the
    runs that finished, in the order of ``recipes``.

    Raises:
        ValueError: a recipe is broken, or two recipes name the same model; FileExistsError:
        a model is in ``out_dir`` already and ``overwrite`` is False (all checked before any
        run starts); RuntimeError: some of several runs failed (after the others finished; it
        names each failed recipe and its error, and the finished models stay written). A
        single run raises its own error.
    """
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1; got {jobs!r}.")
    if stop_after is not None and not stop_after >= 0:
        raise ValueError(f"stop_after must be a number of seconds >= 0; got {stop_after!r}.")
    if not recipes:
        raise ValueError("No recipes given: name at least one (a zoo recipe or a JSON path).")
    names = [load_recipe(r)["name"] for r in recipes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"Recipes {twice} are given twice (or two recipes share the name): each run writes "
            "the model its recipe names, so the runs would overwrite each other."
        )
    if skip_trained and overwrite:
        raise ValueError("skip_trained leaves trained models alone, overwrite replaces them: "
                         "pass one of them.")  # fmt: skip
    folder = Path(out_dir) if out_dir is not None else zoo.models_dir()
    if skip_trained:
        have = set(trained(folder, names))
        recipes = [r for r, n in zip(recipes, names, strict=True) if n not in have]
        names = [n for n in names if n not in have]
        if not recipes:
            return []
    if not overwrite:
        refuse_to_overwrite(folder, names)  # with skip_trained: half-written models
    options = {"out_dir": out_dir, "epochs": epochs, "overwrite": overwrite, "device": device,
               "readme": False}  # fmt: skip
    deadline = None if stop_after is None else time.monotonic() + stop_after
    try:
        if jobs == 1 or len(recipes) == 1:
            return _one_at_a_time(recipes, options, deadline, progress, report)
        return _side_by_side(recipes, jobs, options, deadline, progress, report)
    finally:  # once, after every run: processes side by side would overwrite each other's
        if folder.is_dir():
            write_models_readme(folder)


def _one_at_a_time(recipes, options, deadline, progress, report) -> list[dict]:
    cards, failed = [], []
    for started, recipe in enumerate(recipes):
        if _past(deadline):
            _warn_not_started(recipes[started:])
            break
        try:
            cards.append(run_recipe(recipe, progress=progress, **options))
        except Exception as error:
            if len(recipes) == 1:
                raise  # one run: its own error, as `run_recipe` raises it
            _warn_failed(recipe, error)
            failed.append((recipe, error))
            continue
        if report is not None:
            report(cards[-1])
    _raise_failures(failed, len(recipes))
    return cards


def _side_by_side(recipes, jobs, options, deadline, progress, report) -> list[dict]:
    """At most ``jobs`` runs in flight; a new one starts when one ends (and before the
    deadline). Spawned processes (a forked one would inherit this one's torch state), each
    with its share of the cores unless its recipe sets ``threads``. A worker that dies (killed,
    out of memory) fails the runs in flight with it, and a fresh pool takes the rest; an
    interrupt stops every worker at once."""
    threads = max(1, (os.cpu_count() or 1) // min(jobs, len(recipes)))
    done: dict[int, dict] = {}
    failed: list[tuple[str | Path, BaseException]] = []
    waiting = list(enumerate(recipes))[::-1]
    running: dict[Future, tuple[int, str | Path]] = {}
    bar = tqdm(total=len(recipes), desc="runs", disable=not progress)
    pool = _pool(jobs, threads)
    try:
        while waiting or running:
            while waiting and len(running) < jobs and not _past(deadline):
                index, recipe = waiting.pop()
                future = pool.submit(run_recipe, recipe, progress=False, **options)
                running[future] = (index, recipe)
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            if any(isinstance(f.exception(), BrokenProcessPool) for f in finished):
                finished = list(running)  # a dead worker breaks the pool: every run in it
                pool.shutdown(wait=False, cancel_futures=True)
                pool = _pool(jobs, threads)
            for future in finished:
                index, recipe = running.pop(future)
                bar.update()
                error = future.exception()
                if isinstance(error, BrokenProcessPool):
                    error = RuntimeError("a worker process died while this run was under way "
                                         "(killed, or out of memory?)")  # fmt: skip
                if error is not None:
                    _warn_failed(recipe, error)
                    failed.append((recipe, error))
                    continue
                done[index] = future.result()
                if report is not None:
                    report(done[index])
    except BaseException:
        _stop_workers(pool)
        raise
    finally:
        bar.close()
    pool.shutdown()
    if waiting:
        _warn_not_started([recipe for _, recipe in waiting[::-1]])
    _raise_failures(failed, len(recipes))
    return [done[i] for i in sorted(done)]


def _pool(jobs: int, threads: int) -> ProcessPoolExecutor:
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(jobs, context, torch.set_num_threads, (threads,))


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate the pool's processes now (its shutdown would wait for the runs under way)."""
    processes = list((pool._processes or {}).values())  # the executor has no public handle
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():  # a run that ignores SIGTERM
            process.kill()
            process.join()


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _warn_not_started(recipes: Sequence[str | Path]) -> None:
    names = ", ".join(Path(r).stem for r in recipes[:5]) + (", ..." if len(recipes) > 5 else "")
    warnings.warn(
        f"stop_after: {len(recipes)} runs not started ({names}); the same command with "
        "--skip-trained (skip_trained=True) and without --force trains them.",
        stacklevel=3,
    )


def _warn_failed(recipe: str | Path, error: BaseException) -> None:
    """Say at once that a run failed (the sweep goes on), with the worker's traceback."""
    remote = f"\n{error.__cause__}" if error.__cause__ is not None else ""
    warnings.warn(f"{recipe} failed: {type(error).__name__}: {error}{remote}", stacklevel=3)


def _raise_failures(failed: list[tuple[str | Path, BaseException]], total: int) -> None:
    if failed:
        lines = "; ".join(f"{recipe}: {type(e).__name__}: {e}" for recipe, e in failed)
        raise RuntimeError(
            f"{len(failed)} of {total} runs failed (the others' models are written): {lines}"
        )
