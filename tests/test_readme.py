"""The README is the entry point: short, its quickstart runs and does what it says; the hook
example of the manual runs too."""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vizkit as vk

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
HOOKS = ROOT / "docs" / "concepts" / "hooks.md"


def python_blocks(file: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", file.read_text(), re.S)


def run(block: str, name: str, scope: dict | None = None) -> dict:
    scope = {} if scope is None else scope
    exec(compile(block, name, "exec"), scope)
    return scope


def test_readme_is_an_entry_point():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for link in re.findall(r"\]\(([^)#]+)\)", text):  # every relative link resolves
        assert link.startswith("http") or (ROOT / link).exists(), link
    quickstart, own_model = python_blocks(README)
    assert len(quickstart.strip().splitlines()) <= 10 and len(own_model.splitlines()) <= 10


def test_readme_quickstart_runs_as_pasted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing of the reader's is needed
    with pytest.warns(UserWarning, match="constant maps"):  # one Grad-CAM map is flat here
        scope = run(python_blocks(README)[0], "README.md")
    assert tuple(scope["yours"].x.shape) == (2, 3, 32, 32) and scope["yours"].names[0] == "image 0"
    assert scope["maps"].layers == [0, 3] and tuple(scope["cam"].maps.shape) == (8, 8, 8)
    assert scope["table"].methods == vk.methods.default_methods(True)  # the report's
    assert scope["fig"].data and "class token" in scope["fig"].layout.title.text


@pytest.mark.slow
def test_readme_own_model_and_photo_runs(tmp_path, monkeypatch):
    """The second block on the reader's photo (a file made here) with random-init DINOv2 and
    CLIP (the weights are the reader's): what it says it gives."""
    monkeypatch.chdir(tmp_path)
    yy, xx = np.mgrid[0:240, 0:320]
    pixels = np.stack([xx % 256, yy % 256, (xx * yy) % 256], -1).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "photo.jpg")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights: flat maps
        scope = run(python_blocks(README)[1], "README.md block 2")
    assert "timm's data config" in scope["photo"].preprocessing.source
    assert tuple(scope["cam"].maps.shape) == (1, 37, 37) and scope["cam"].targets is None
    assert tuple(scope["alike"].maps.shape) == (1, 37, 37)
    assert tuple(scope["x"].shape) == (1, 3, 224, 224) and tuple(scope["lrp"].maps.shape) == (
        1, 224, 224)  # fmt: skip


def test_hook_example_runs_and_shows_what_it_says():
    scope = run(python_blocks(HOOKS)[0], "docs/concepts/hooks.md")
    assert tuple(scope["cache"].stack("attn.hook_pattern").shape) == (4, 64, 4, 65, 65)
    assert "blocks.3.norm1.hook_out_grad" in scope["grads"]
    assert not (scope["uniform_logits"] - scope["logits"]).abs().max() < 1e-6  # the edit acts


@pytest.mark.slow
def test_timm_model_how_to_runs_and_shows_what_it_says():
    scope: dict = {}
    for i, block in enumerate(python_blocks(ROOT / "docs" / "how-to" / "your-timm-model.md")):
        run(block, f"your-timm-model.md block {i}", scope)
    assert tuple(scope["x_photo"].shape) == (1, 3, 224, 320) and scope["files"] == ["image 0"]
    assert scope["fig"].data and scope["shown"].shape == (1, 224, 320, 3)
    grids = [stage.layout.grid for stage in scope["stages"]]  # Swin: one result per stage
    assert grids == [(28, 28), (14, 14), (7, 7), (4, 4)]


def test_add_a_family_how_to_runs_and_shows_what_it_says():
    """docs/how-to/add-an-adapter.md: a family registered from one file gives a custom ViT its
    names and analyses, and its test's oracle holds."""
    scope = {"__name__": "add_a_family_how_to"}
    for i, block in enumerate(python_blocks(ROOT / "docs" / "how-to" / "add-an-adapter.md")[1:]):
        run(block, f"add-an-adapter.md block {i + 1}", scope)
    hm = scope["hm"]
    assert hm.family.family == "toy" and hm.tap("stack.1.attn.hook_pattern").kind == "self"
    assert "stack.0.hook_attn_out" in hm.hook_names()


def test_other_libraries_how_to_runs_and_shows_what_it_says():
    """docs/how-to/other-libraries.md: its Python blocks run on random-init models (the
    from_pretrained lines are shown in text blocks, nothing is downloaded)."""
    scope = {"__name__": "other_libraries_how_to"}
    for i, block in enumerate(python_blocks(ROOT / "docs" / "how-to" / "other-libraries.md")):
        run(block, f"other-libraries.md block {i}", scope)
    assert tuple(scope["maps"].patterns.shape) == (2, 4, 2, 17, 17)
    assert tuple(scope["dog"].maps.shape) == (4, 4, 4)
    assert tuple(scope["alike"].maps.shape) == (4, 4, 4) and scope["cam"].targets is None
    assert tuple(scope["by_words"].maps.shape) == (4, 32, 32)
    assert [s.layout.grid for s in scope["stages"]] == [(16, 16), (8, 8)]


def test_add_a_saliency_method_how_to_runs_and_shows_what_it_says():
    """docs/how-to/add-a-saliency-method.md: a method registered from one cell runs in
    compare_saliency and its test's equation holds."""
    scope = {"__name__": "add_a_saliency_method_how_to"}
    for i, block in enumerate(python_blocks(ROOT / "docs" / "how-to" / "add-a-saliency-method.md")):
        run(block, f"add-a-saliency-method.md block {i}", scope)
    assert scope["table"].methods == ["absgradcam", "gradcam", "random"]
    assert "absgradcam" in vk.methods.METHODS


def test_add_a_metric_how_to_runs_and_shows_what_it_says():
    """docs/how-to/add-a-metric.md: a metric registered from one cell is scored by
    compare_saliency and evaluate, and its last block removes it from the registry."""
    scope = {"__name__": "add_a_metric_how_to"}
    *blocks, last = python_blocks(ROOT / "docs" / "how-to" / "add-a-metric.md")
    try:
        for i, block in enumerate(blocks):
            run(block, f"add-a-metric.md block {i}", scope)
        assert scope["table"].metrics == ["peak_share", "deletion_auc"]
        assert scope["evaluated"].per_image.shape == (2, 1, 16)
        assert "peak_share ↑" in str(scope["table"])
    finally:
        run(last, "add-a-metric.md's last block", scope)
    assert "peak_share" not in vk.metrics.METRICS and "| peak_share |" in str(scope["table"])


def test_readme_lists_every_registered_saliency_method():
    """The README's paragraph on the methods is generated from the registry (docs/generate.py
    rewrites it between its markers): it is current, and names each method."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate", ROOT / "docs" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    assert generate.readme_methods() in README.read_text(), "run python docs/generate.py"
    for name, method in vk.methods.METHODS.items():  # other tests register methods of theirs
        if name != "random" and method.fn.__module__.startswith("vizkit."):
            assert f"`{name}`" in generate.readme_methods()


def test_evaluate_explanations_how_to_runs_and_shows_what_it_says():
    scope: dict = {}
    for i, block in enumerate(python_blocks(ROOT / "docs" / "how-to" / "evaluate-explanations.md")):
        run(block, f"evaluate-explanations.md block {i}", scope)
    checks = {c.method: c for c in scope["checks"]}
    assert (checks["random"].similarity["spearman"] == 1).all()  # it fails the test
    assert checks["gradcam"].similarity["spearman_abs"][0].nanmean() < 0.5  # head random
    assert checks["rollout"].similarity["spearman_abs"][:2].nanmean() > 0.95  # ignores head
    fading = checks["attnlrp"].similarity["spearman_abs"].nanmean(1)
    assert fading[-1] < fading[0] - 0.3
    table = scope["table"]
    assert table.methods == ["gradcam", "attnlrp", "random"] and scope["best"] == "attnlrp"


def test_mechanistic_views_how_to_runs_and_shows_what_it_says():
    scope: dict = {}
    for i, block in enumerate(python_blocks(ROOT / "docs" / "how-to" / "mechanistic-views.md")):
        run(block, f"mechanistic-views.md block {i}", scope)
    dla, lens, patching = scope["dla"], scope["lens"], scope["patching"]
    assert dla.contributions.shape == (16, 9) and dla.heads.shape == (16, 4, 4)
    assert lens.pooled.shape == (8, 5, 10) and lens.maps().shape == (8, 5, 8, 8)
    assert patching.resid.shape == (8, 4, 65) and patching.heads.shape == (8, 4, 4)
    assert torch.allclose(patching.region[:, 0], torch.ones(8), atol=1e-4)
    assert scope["heads"].accuracy.shape == (16,)
