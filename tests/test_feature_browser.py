"""FeatureBrowser: its list, heat maps, clicks, orders and intervention bars are the
`vk.sae` results they show; wrong images are refused; the model is left as it was."""

from __future__ import annotations

import pytest
import torch
from test_sae import state

import vizkit as vk
from vizkit.sae.effects import ablation, edited_outputs, model_outputs, steering
from vizkit.widgets import FeatureBrowser
from vizkit.widgets.feature_browser import CLICK_HINT


@pytest.fixture(scope="module")
def browsed(tmp_path_factory):
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images = vk.datasets.load_sample()[0]
    folder = tmp_path_factory.mktemp("browser")
    store = vk.cache_activations(model, "shapes", folder / "s", layers=[-2], tokens="all",
                                 progress=False)  # fmt: skip
    sae = vk.train_sae(store, expansion=2, k=8, tokens=10 * len(store), batch_size=256,
                       progress=False)  # fmt: skip
    before = state(model)
    browser = FeatureBrowser(model, sae, images, classes=vk.datasets.SHAPE_CLASSES, top=4)
    return model, images, sae, browser, before


def heatmaps(browser) -> list:
    return [t for t in browser.figure.data if t.type == "heatmap"]


def test_the_list_and_the_maps_are_the_features(browsed):
    model, images, sae, browser, before = browsed
    found = vk.sae.features(sae, top=4, progress=False)
    listed = [value for _, value in browser.latent.options]
    assert listed == found.by_density()[:200].tolist()
    latent = listed[1]
    browser.latent.value = latent
    shown = found.top_images(latent, 4)
    maps = heatmaps(browser)
    assert [t.meta for t in maps] == [image for image, _ in shown]
    for trace, (image, _) in zip(maps, shown, strict=True):
        torch.testing.assert_close(torch.tensor(trace.z, dtype=torch.float32),
                                   found.heatmap(latent, image), equal_nan=True)  # fmt: skip
    result = vk.sae.ablate(model, sae, images[[i for i, _ in shown]], latent)
    bars = [t for t in browser.figure.data if t.type == "bar"]
    clean = result.clean.softmax(-1).mean(0)
    names = list(bars[0].x)
    want = [float(clean[vk.datasets.SHAPE_CLASSES.index(n)]) for n in names]
    assert list(bars[0].y) == pytest.approx(want, abs=1e-6)
    assert CLICK_HINT in browser.figure.layout.title.text
    assert CLICK_HINT not in browser.static().layout.title.text
    assert state(model)[:2] == before[:2]


def test_a_click_lists_the_latents_at_that_patch(browsed):
    model, images, sae, browser, _ = browsed
    trace = heatmaps(browser)[0]
    image = trace.meta  # the redraw after the click reuses the trace

    class Points:  # the centre of patch (row 2, col 3) of an 8 x 8 grid on 32 px
        xs, ys = [3 * 4 + 1.5], [2 * 4 + 1.5]

    trace._click_callbacks[0](trace, Points(), None)
    assert browser.order.value == "clicked patch"
    token = 1 + 2 * 8 + 3
    assert browser.clicked == (image, token)
    found = vk.sae.features(sae, top=4, progress=False)
    want = [i for i, _ in found.at_token(image, token, count=200)]
    assert [value for _, value in browser.latent.options] == want


def test_the_logit_effect_order_and_steering(browsed):
    model, images, sae, browser, _ = browsed
    browser.order.value = "logit effect"
    browser.cls.value = 3
    effects = vk.sae.logit_effects(model, sae, images[:16])
    found = vk.sae.features(sae, top=4, progress=False)
    order = effects.by_class(3)
    want = order[found.density[order] > 0][:200].tolist()
    assert [value for _, value in browser.latent.options] == want
    assert "ring" in browser.latent.options[0][0]
    browser.action.value = "steer"
    assert not browser.strength.disabled and browser.cls.disabled is False
    computed = browser.computed
    browser.strength.value = 0.0
    bars = [t for t in browser.figure.data if t.type == "bar"]
    assert list(bars[0].y) == pytest.approx(list(bars[1].y))  # a zero step changes nothing
    browser.strength.value = 1.0
    browser.strength.value = 0.0
    assert browser.computed == computed + 1  # revisiting a strength is cached


def test_images_other_than_the_store_are_refused(browsed):
    model, images, sae, _, _ = browsed
    with pytest.raises(ValueError, match="holds 64 images; 8 were given"):
        FeatureBrowser(model, sae, images[:8])
    with pytest.raises(ValueError, match=r"differ from the ones the store"):
        FeatureBrowser(model, sae, images.flip(0))


def test_the_class_search_cuts_the_list_and_keeps_the_class(browsed):
    _, _, _, browser, _ = browsed
    browser.order.value = "logit effect"
    names = list(vk.datasets.SHAPE_CLASSES)
    browser.cls.value = names.index("ring")
    browser.find.value = "RI"  # any case
    assert [name for name, _ in browser.cls.options] == [n for n in names if "ri" in n]
    assert browser.cls.value == names.index("ring")
    browser.find.value = "no such class"  # nothing holds it: the list stays
    assert [name for name, _ in browser.cls.options] == [n for n in names if "ri" in n]
    browser.find.value = ""
    assert len(browser.cls.options) == len(names)
    browser.order.value = "density"
    assert browser.find.disabled and browser.cls.disabled


def test_the_bars_equal_the_public_intervention(browsed):
    """The browser computes each image's clean output once and the edited ones per latent:
    its bars equal `vk.sae.ablate` on the same images."""
    model, images, sae, browser, _ = browsed
    browser.action.value = "ablate"
    latent = browser.latent.options[2][1]
    browser.latent.value = latent
    shown = [i for i, _ in vk.sae.features(sae, top=4, progress=False).top_images(latent, 4)]
    result = vk.sae.ablate(model, sae, images[shown], latent)
    clean, edited = result.clean.softmax(-1).mean(0), result.edited.softmax(-1).mean(0)
    bars = [t for t in browser.figure.data if t.type == "bar"]
    names = list(bars[0].x)
    index = [list(vk.datasets.SHAPE_CLASSES).index(n) for n in names]
    assert list(bars[0].y) == pytest.approx(clean[index].tolist(), abs=1e-6)
    assert list(bars[1].y) == pytest.approx(edited[index].tolist(), abs=1e-6)


def test_edits_run_from_the_layer_and_equal_the_whole_model(browsed):
    """The logit effects' forward gives the first 16 images' outputs and proves the path from
    the autoencoder's layer on (`vizkit.analysis.resume`); edits along it equal the whole
    model's, to 1e-5 of the outputs' scale."""
    model, images, sae, browser, before = browsed
    outputs = browser.outputs
    assert outputs.why == "" and outputs.resumed is not None
    assert set(range(16)) <= set(outputs.outputs)
    chosen = [0, 5, 20, 63]
    for edit, _ in (ablation(sae, [1, 3]), steering(sae, 2, 1.5)):
        want = edited_outputs(model, sae, images[chosen], edit)
        torch.testing.assert_close(outputs.edited(chosen, edit), want, rtol=0,
                                   atol=1e-5 * float(want.abs().max()))  # fmt: skip
    want = model_outputs(model, images[chosen])
    torch.testing.assert_close(outputs.clean(chosen), want, rtol=0,
                               atol=1e-5 * float(want.abs().max()))  # fmt: skip
    assert state(model)[:2] == before[:2]


def test_names_from_a_dissection_label_the_list_and_the_title(browsed):
    model, images, sae, _, _ = browsed
    test_images, concepts = vk.concepts.shapes_concepts(64)
    found = vk.concepts.dissect(model, test_images, concepts, sae, quantile=0.02, progress=False)
    named = vk.concepts.unit_names(found)
    assert named, "no latent detects a concept"
    browser = FeatureBrowser(model, sae, images, classes=vk.datasets.SHAPE_CLASSES, top=4,
                             names=found)  # fmt: skip
    labels = dict((value, label) for label, value in browser.latent.options)
    for latent, label in labels.items():
        name = found.labels[latent]
        expected = f"{latent} {name}: fires" if latent in named else f"{latent}: fires"
        assert label.startswith(expected), label
    latent = next(latent for latent in labels if latent in named)
    browser.latent.value = latent
    assert f"'{named[latent]}'" in browser.figure.layout.title.text
    assert named[latent].startswith(found.labels[latent] + " (IoU ")
    channels = vk.concepts.dissect(model, test_images, concepts, "blocks.3.hook_resid_post",
                                   progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="other units"):
        FeatureBrowser(model, sae, images, names=channels)
