"""The store -> autoencoder -> spliced-in score -> features -> maps -> ablation -> browser path
on a model of each library vizkit covers (and a few timm families of other shapes, and a
user's wrapper): it runs, or is refused with a ValueError that says why, and leaves the model
as it was."""

from __future__ import annotations

import pytest
import timm
import torch
from representatives import drawn
from test_sae import state

import vizkit as vk
from vizkit import coverage
from vizkit.hooks.inputs import video_input
from vizkit.hooks.scores import is_dense
from vizkit.models import representatives
from vizkit.sae.effects import ablation, edited_outputs
from vizkit.widgets import FeatureBrowser

TIMM = ("vision_transformer", "deit", "eva", "cait", "swin_transformer", "xcit", "resnet")


def cases() -> list:
    params = [
        pytest.param(m.build, m.size, id=f"{library}:{name}")
        for library, models in representatives.LIBRARIES.items()
        for name, m in models.items()
    ]
    for family in TIMM:
        r = representatives.FAMILIES[family]
        params.append(pytest.param(lambda r=r: timm.create_model(r.model, **r.kwargs), r.size,
                                   id=family))  # fmt: skip
    return params


class Wrapper(torch.nn.Module):
    """A user's module around a timm ViT."""

    def __init__(self) -> None:
        super().__init__()
        vit = representatives.FAMILIES["vision_transformer"]
        self.backbone = timm.create_model(vit.model, **vit.kwargs)

    def forward(self, x):
        return self.backbone(x)


@pytest.mark.slow
@pytest.mark.parametrize(("make", "size"), [*cases(), pytest.param(Wrapper, 64, id="wrapper")])
def test_store_autoencoder_and_splice_on_each_library(make, size, tmp_path):
    model = drawn(make)
    x = coverage._images(model, size)[:3]
    before = state(model)
    try:
        store = vk.cache_activations(model, x, tmp_path / "s", progress=False)
    except ValueError as error:
        assert "token" in str(error), error
        assert state(model)[:2] == before[:2]
        return
    sae = vk.train_sae(store, expansion=1, k=2, batch_size=min(32, len(store)), progress=False)
    if is_dense(model):  # no class probabilities nor embedding to move: refused by name
        for effect in (lambda: vk.sae.spliced_score(model, sae, (x,), progress=False),
                       lambda: vk.sae.ablate(model, sae, x, 0),
                       lambda: FeatureBrowser(model, sae, x, top=2)):  # fmt: skip
            with pytest.raises(ValueError, match="returns a map per image.*vk.targets.segment"):
                effect()
        found = vk.sae.features(sae, top=2, progress=False)
        assert 0 < found.by_density().numel() == int((found.density > 0).sum())
        return
    score = vk.sae.spliced_score(model, sae, (x,), progress=False)
    assert score.images == 3
    assert (score.kl is not None and score.kl >= 0) or -1 <= score.embedding_cosine <= 1
    found = vk.sae.features(sae, top=2, progress=False)
    latent = int(found.by_density()[0])
    image = found.top_images(latent, 1)[0][0]
    maps = vk.sae.latent_maps(model, sae, x[image : image + 1], [latent])  # a forward
    torch.testing.assert_close(maps[0, 0], found.heatmap(latent, image), rtol=1e-4, atol=1e-4)
    result = vk.sae.ablate(model, sae, x, latent)
    assert result.output == ("logits" if score.kl is not None else "embedding")
    if video_input(model) is not None:  # the browser draws images
        with pytest.raises(ValueError, match=r"FeatureBrowser\(\) does not take videos yet"):
            FeatureBrowser(model, sae, x, top=2)
        return
    browser = FeatureBrowser(model, sae, x, top=2)
    assert browser.latent.value == latent and browser.static().layout.title.text
    edit, _ = ablation(sae, latent)  # from the layer on where the family's path is proved
    want = edited_outputs(model, sae, x, edit)
    torch.testing.assert_close(browser.outputs.edited([2, 0, 1], edit), want[[2, 0, 1]],
                               rtol=0, atol=1e-5 * float(want.abs().max()))  # fmt: skip
    after = state(model)
    assert after[:2] == before[:2]
    assert all(torch.equal(v, after[2][k]) for k, v in before[2].items())
