"""Scale-out: two gloo processes launched by torchrun, each with half of the batches, give the
matrix one process computes (the README's torchrun command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vizkit import zoo
from vizkit.analysis import cka_matrix
from vizkit.analysis.result import Result
from vizkit.datasets import model_batch


@pytest.mark.slow
def test_two_gloo_processes_give_the_single_process_matrix(tmp_path):
    out = tmp_path / "cka.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "-m", "vizkit.cli", "cka", "--model", "vit_tiny_shapes", "--samples", "96",
        "--batch-size", "16", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # gloo on CPU even where a GPU exists
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    distributed = Result.from_dict(json.loads(out.read_text()))
    assert distributed.options["processes"] == 2
    assert distributed.options["batches"] == 6 and distributed.options["examples"] == 96

    model, card = zoo.load("vit_tiny_shapes")
    images = model_batch(model, None, 96, card).images
    single = cka_matrix(model, images, batch_size=16, progress=False)
    assert distributed.layers_a == single.layers_a
    assert torch.allclose(distributed.matrix, single.matrix, atol=1e-10, rtol=0)
    # not vacuous: the matrix has structure (early and late blocks differ)
    assert single.matrix.min() < 0.9
