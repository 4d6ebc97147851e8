"""The wheel works outside the checkout: it carries the package, the recipes, the Shapes sample and
the core zoo models; installed into a fresh virtual environment, `vizkit report` runs offline
from a folder that is not the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE_MODELS = ("vit_tiny_shapes", "cait_tiny_shapes", "resnet_tiny_shapes", "vit_tiny_digits",
               "vit_tiny_shapes_random_labels", "clip_shapes", "vivit_shape_clips",
               "dpt_shape_masks")  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (found,) = out.glob("vizkit-*.whl")
    return found


def test_the_wheel_carries_the_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for model in CORE_MODELS:
        assert {
            f"vizkit/zoo_models/{model}.json",
            f"vizkit/zoo_models/{model}.safetensors",
        } <= names
    assert "vizkit/datasets/shapes_sample.npz" in names
    assert "vizkit/train/recipes/vit_tiny_shapes.json" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("models/", "tests/", "notebooks/")) for n in names)
    assert not any("masks_gmm" in n and n.endswith(".safetensors") for n in names)  # paper study


@pytest.mark.slow
def test_an_installed_wheel_runs_the_report_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    # the dependencies (torch, timm, ...) come from this environment: a path line in a .pth is
    # added to sys.path without running that folder's .pth files, so the checkout's editable
    # vizkit stays out
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VIZKIT_MODELS", "PYTHONPATH")} | {
        "HF_HUB_OFFLINE": "1",
        "PIP_NO_INDEX": "1",
    }
    where = subprocess.run(
        [python, "-c", "import vizkit, vizkit.zoo as z; print(vizkit.__file__); "
         "print(z.models_dirs()); print(z.list_models())"],
        cwd=work, env=env, check=True, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    assert where[0].startswith(site), where  # the installed package, not the checkout
    assert where[1] == f"[PosixPath('{site}/vizkit/zoo_models')]"
    assert eval(where[2]) == sorted(CORE_MODELS)
    run = subprocess.run(
        [venv / "bin" / "vizkit", "report", "--n", "4", "--out", "report"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    page = (work / "report" / "index.html").read_text()
    assert "vit_tiny_shapes" in page and "committed Shapes sample" in page
    missing = subprocess.run(
        [python, "-c", "import vizkit; vizkit.zoo.load('masks_gmm_k5_s0')"],
        cwd=work, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert "paper-study checkpoint, not shipped inside the package" in missing.stderr
