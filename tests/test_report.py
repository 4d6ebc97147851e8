"""`vizkit report`: one self-contained page with the sections that apply to the model."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from PIL import Image

from vizkit import zoo
from vizkit.cli import main
from vizkit.report import build_report
from vizkit.report.inputs import load_inputs
from vizkit.report.sections import SECTIONS, NotApplicable


def figures_in(page: str) -> int:
    return len(re.findall(r'class="plotly-graph-div"', page))


class ExternalResources(HTMLParser):
    """Collects what a page would fetch: script src, link href, img src."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("src", "href"):
            if tag in ("script", "link", "img") and attrs.get(key):
                self.urls.append(attrs[key])


def test_default_report_is_self_contained_with_every_vit_section(tmp_path):
    page_path = build_report(out=tmp_path, progress=False)
    page = page_path.read_text()
    assert page_path == tmp_path / "index.html"
    resources = ExternalResources()
    resources.feed(page)
    assert resources.urls == []  # plotly.js is embedded: the page opens offline
    assert page.count("Plotly.newPlot") == figures_in(page) >= 12
    titles = ["Predictions", "Attention rollout", "Saliency methods compared",
              "Representation similarity (CKA)", "Residual-norm ratios", "Training"]  # fmt: skip
    for title in titles:
        assert f"<h2>{title}</h2>" in page
    assert "Learned attention masks" not in page.split("Not applicable")[0]
    assert "pointing_game" in page  # the Shapes sample has object masks
    assert "4 blocks, width 128, 4 heads; patch 4x4 at 32x32" in page  # the real config
    assert "(no LayerScale)" in page and "with LayerScale" not in page  # vit_tiny has none


def test_cait_report_has_class_attention_and_layerscale(tmp_path):
    page = build_report("cait_tiny_shapes", n=2, out=tmp_path, progress=False).read_text()
    assert "<h2>Class-attention saliency</h2>" in page
    assert "LayerScale diag(" in page


def test_cnn_report_says_what_does_not_apply(tmp_path):
    page = build_report("resnet_tiny_shapes", n=2, out=tmp_path, progress=False).read_text()
    not_applicable = page.split("Not applicable to this model")[1]
    assert "attention" in not_applicable and "residual_ratios" in not_applicable
    assert "<h2>Saliency methods compared</h2>" in page


def test_sections_raise_not_applicable_rather_than_failing():
    inputs = load_inputs("resnet_tiny_shapes", n=2)
    for name in ("attention", "rollout", "class_attention", "residual_ratios", "masks"):
        with pytest.raises(NotApplicable):
            SECTIONS[name](inputs)


def test_image_folder_and_checkpoint_path(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    (folder / "notes.txt").write_text("not an image")
    with pytest.warns(UserWarning, match="notes.txt"):
        page = build_report(str(zoo.path("vit_tiny_digits")), data=str(folder), out=tmp_path / "r",
                            progress=False)  # fmt: skip
    text = page.read_text()
    assert "3 images from" in text and "Saliency methods compared" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "no_such_model"], "neither a zoo model"),
        (["--data", "/no/such/folder"], "neither 'shapes', 'digits' nor an existing"),
        (["--n", "500"], "--n must be 1..64"),
        (["--model", "README.safetensors"], "needs the file and its card"),
    ],
)
def test_bad_arguments_exit_with_one_line(tmp_path, capsys, args, message):
    assert main(["report", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_empty_folder_and_unreadable_images_exit_with_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", "--data", str(empty), "--out", str(tmp_path / "a")]) == 2
    assert "holds no readable image" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "photo.png").write_bytes(b"\x89PNG not really")
    assert main(["report", "--data", str(broken), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds no readable image" in err and "photo.png (not an image)" in err
    assert "\n" not in err


def test_masked_model_report_shows_its_learned_masks(tmp_path):
    page = build_report("masks_gmm_k5_s0", n=2, out=tmp_path, progress=False).read_text()
    assert "<h2>Learned attention masks</h2>" in page
    assert "Mask against distance" in page and "GMM paper Fig. 3" in page


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """A random-init timm ViT with ImageNet's 1000 classes (32 px, 8 px patches, 2 blocks) as a
    checkpoint with its card and no data set of its own."""
    import hashlib
    import json

    import timm
    from safetensors.torch import save_file

    kwargs = {"img_size": 32, "patch_size": 8, "depth": 2}
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", **kwargs)
    file = tmp_path_factory.mktemp("wide") / "wide.safetensors"
    save_file(model.state_dict(), str(file))
    card = {"architecture": "vit_tiny_patch16_224", "kwargs": kwargs,
            "sha256": hashlib.sha256(file.read_bytes()).hexdigest()}  # fmt: skip
    file.with_suffix(".json").write_text(json.dumps(card))
    return str(file)


def test_a_1000_class_model_on_shapes_names_classes_by_index(wide_model, tmp_path, capsys):
    args = ["--model", wide_model, "--data", "shapes", "--n", "2", "--out", str(tmp_path)]
    assert main(["report", *args]) == 0
    page = (tmp_path / "index.html").read_text()
    assert "<h2>Predictions</h2>" in page and "Saliency methods compared" in page
    assert "not of this model&#x27;s 1000 classes" in page  # the Shapes labels are dropped
    assert "class names do not fit" not in page  # the Shapes names are never offered
    assert "near chance" in page and "class='caution'" in page
    assert "Traceback" not in capsys.readouterr().err


def test_labels_and_class_names_are_kept_only_where_they_are_the_models():
    own = load_inputs("vit_tiny_shapes", n=2)
    assert own.labels is not None and len(own.classes) == 10 and own.class_note == ""
    other = load_inputs("vit_tiny_digits", "shapes", n=2)
    assert other.labels is None  # Shapes labels are not digits
    assert other.classes == zoo.card("vit_tiny_digits")["classes"]
    assert "classes of shapes, not of this model's 10 classes" in other.class_note


def test_freed_memory_is_returned_only_where_glibc_can(monkeypatch):
    import ctypes

    import vizkit.report as report

    trimmed = []

    class Libc:
        def malloc_trim(self, pad):
            trimmed.append(pad)

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    monkeypatch.setattr(report.sys, "platform", "linux")
    report._return_freed_memory()
    assert trimmed == [0]
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())  # a C library without it
    report._return_freed_memory()
    for platform in ("darwin", "win32"):  # CDLL(None) is not even valid on Windows
        monkeypatch.setattr(report.sys, "platform", platform)
        monkeypatch.setattr(ctypes, "CDLL", lambda name: pytest.fail("CDLL called"))
        report._return_freed_memory()


def test_the_trust_checks_are_one_flag_away_and_sections_can_be_chosen(tmp_path, capsys):
    from vizkit.report import HEAVY_SECTIONS, chosen_sections

    assert "evaluation" not in chosen_sections("default") and HEAVY_SECTIONS == ("evaluation",)
    assert chosen_sections("all") == list(SECTIONS)
    assert chosen_sections(["history", "summary"]) == ["summary", "history"]  # page order
    assert chosen_sections("history") == ["history"]  # one name, not its letters
    page = build_report(n=2, out=tmp_path, sections=["summary", "history"]).read_text()
    assert "<h2>Training</h2>" in page and "Attention rollout" not in page
    assert "report: history took" in capsys.readouterr().err  # each section's cost
    with pytest.raises(ValueError, match=r"Unknown report sections \['saliencey'\]"):
        chosen_sections(["saliencey"])


@pytest.mark.slow
def test_the_trust_section_runs_when_asked_for(tmp_path):
    page = build_report(n=2, out=tmp_path, sections=["evaluation"], progress=False).read_text()
    assert "<h2>Can these explanations be trusted?</h2>" in page
    assert figures_in(page) == 3  # randomization curves, further scores, ROAD curves


def test_report_command_takes_sections(tmp_path, capsys):
    from vizkit.cli import main

    assert main(["report", "--n", "2", "--out", str(tmp_path), "--sections", "summary"]) == 0
    assert "<h2>Predictions</h2>" not in (tmp_path / "index.html").read_text()
    with pytest.raises(SystemExit):
        main(["report", "--sections", "summary,nope"])
    assert "Unknown report sections ['nope']" in capsys.readouterr().err


@pytest.mark.slow
def test_a_backbones_report_explains_its_embedding_not_a_class(tmp_path):
    """timm's EVA02 is a backbone (num_classes=0): no predictions to show, and the saliency
    maps explain the embedding's norm, never the argmax of an embedding as a class."""
    chosen = ["predictions", "saliency"]
    page = build_report("eva02_tiny_patch14_224", data="shapes", n=2, out=tmp_path,
                        sections=chosen, progress=False).read_text()  # fmt: skip
    assert "<h2>Saliency methods compared</h2>" in page and "<h2>Predictions</h2>" not in page
    assert "is a backbone: it returns embeddings, not classes" in page
    assert "explains the norm of each image" in page and "explains class" not in page


@pytest.mark.parametrize("backbone", [False, True])
def test_the_reports_methods_in_slices_give_the_whole_batchs_maps(backbone):
    """AttnLRP runs as many images per backward pass as its byte budget holds (its memory),
    with the maps, classes and relevance of one pass over the batch; also for a score target
    (a backbone)."""
    import timm

    import vizkit as vk
    from vizkit.hooks.passes import images_per_pass, one_image_bytes
    from vizkit.report.sections.saliency_methods import attnlrp_in_passes

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=0 if backbone else 5
    ).eval()  # fmt: skip
    x = torch.randn(5, 3, 32, 32)  # 2 + 2 + 1 images
    hm = vk.HookedModel(model)
    target = vk.targets.embedding_norm() if backbone else torch.tensor([0, 1, 2, 3, 4])
    two_images = 2 * one_image_bytes(model, x, gradients=True)
    chunked = attnlrp_in_passes(hm, x, target, max_bytes=two_images)
    whole = vk.attnlrp(hm, x, target)
    assert images_per_pass(model, x, two_images, True, "attnlrp") == 2 < len(x)
    torch.testing.assert_close(chunked.maps, whole.maps, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(chunked.extras, whole.extras, rtol=1e-5, atol=1e-9)
    assert (chunked.targets is None) == backbone
    if not backbone:
        assert torch.equal(chunked.targets, whole.targets)
    assert chunked.options == whole.options and chunked.method == "attnlrp"


def test_the_reports_passes_hold_at_least_one_image(monkeypatch):
    """The report's byte budget, or one image's pass where that is larger (a model larger than
    the budget is explained an image at a time, not refused)."""
    import timm

    from vizkit.hooks.passes import one_image_bytes
    from vizkit.report.sections import saliency_methods

    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1).eval()
    x = torch.randn(2, 3, 32, 32)
    assert saliency_methods.pass_bytes(model, x) == saliency_methods.PASS_BYTES
    monkeypatch.setattr(saliency_methods, "PASS_BYTES", 1)
    assert saliency_methods.pass_bytes(model, x) == one_image_bytes(model, x, gradients=True)


def test_the_features_section_shows_the_autoencoder_given(tmp_path, capsys):
    """--sae adds the features section: the autoencoder's scores on its store and spliced into
    the model, and the latents of the highest peaks; one of another model is refused."""
    import vizkit as vk

    model, _ = zoo.load("vit_tiny_shapes")
    store = vk.cache_activations(model, "shapes", tmp_path / "store", layers=[-2], tokens="all",
                                 progress=False)  # fmt: skip
    vk.train_sae(store, expansion=2, k=8, tokens=5 * len(store), batch_size=256,
                 checkpoint=tmp_path / "sae", progress=False)  # fmt: skip
    out = tmp_path / "report"
    assert main(["report", "--n", "4", "--out", str(out), "--sections", "features",
                 "--sae", str(tmp_path / "sae")]) == 0  # fmt: skip
    page = (out / "index.html").read_text()
    assert "<h2>Features (sparse autoencoder)</h2>" in page and figures_in(page) == 1
    assert "topk, 256 latents, k=8 on blocks.2.hook_resid_post" in page
    assert "FVU 0." in page and "KL " in page and "accuracy " in page
    skipped = build_report(n=2, out=tmp_path / "r2", sections=["features"], progress=False)
    assert "no sparse autoencoder was given" in skipped.read_text()
    with pytest.raises(ValueError, match="another model or input"):
        build_report("cait_tiny_shapes", n=2, out=tmp_path / "r3", sections=["features"],
                     progress=False, sae=tmp_path / "sae")  # fmt: skip
    with pytest.raises(SystemExit):
        main(["report", "--sae", str(tmp_path), "--out", str(tmp_path / "r4")])
    assert "holds no sparse autoencoder (no sae.json)" in capsys.readouterr().err
    concepts = build_report(n=6, out=tmp_path / "r5", sections=["concepts"], progress=False,
                            sae=tmp_path / "sae").read_text()  # fmt: skip
    assert "<h2>Concepts (sparse autoencoder)</h2>" in concepts and figures_in(concepts) == 1
    assert "<th>latent</th><th>label</th><th>IoU</th>" in concepts
    assert "AttnLRP relevance" in concepts
    skipped = build_report(n=2, out=tmp_path / "r6", sections=["concepts"], progress=False)
    assert "no sparse autoencoder was given" in skipped.read_text()
