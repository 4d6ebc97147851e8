"""Network Dissection, CLIP-Dissect naming, the held-out check, saev's probes, TCAV, CRAFT and
concept-conditional maps on a model of each library vizkit covers (and timm families of other
shapes) and on backbones, their targets through `vizkit.targets`: each runs on a block's output
and on an autoencoder trained from a store of it (dissection also from the store itself), with
results of the right shapes, or is refused with an error that says why, and leaves the model
as it was."""

from __future__ import annotations

import open_clip
import pytest
import timm
import torch
import transformers
from conftest import assert_full_state, full_state
from representatives import drawn, refuses_videos

import vizkit as vk
from vizkit import coverage
from vizkit.analysis.representations import token_stream_layers
from vizkit.datasets.captions import WordTokenizer
from vizkit.hooks.scores import is_dense
from vizkit.models import representatives
from vizkit.models.prompted import PromptedMasks

# TCAV's classifier (captum's SGDClassifier settings) may stop at max_iter on these few images
pytestmark = pytest.mark.filterwarnings("ignore:Maximum number of iteration")

TIMM = ("vision_transformer", "deit", "eva", "cait", "swin_transformer", "xcit")
NAMES = ["left", "top", "centre"]
TEXTS = ["red", "green", "blue"]
TOKENIZER = WordTokenizer(TEXTS, context_length=8)
_SMALL = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
          "num_attention_heads": 2, "intermediate_size": 64}  # fmt: skip


def _open_clip(size: int) -> torch.nn.Module:
    """A seeded one-layer open_clip CLIP on ``size`` px images (a 4 x 4 patch grid) whose
    vocabulary is `TOKENIZER`'s."""
    torch.manual_seed(0)
    return open_clip.model.CLIP(
        embed_dim=16,
        vision_cfg={"image_size": size, "patch_size": size // 4, "width": 32, "layers": 1,
                    "head_width": 16},
        text_cfg={"context_length": 8, "vocab_size": TOKENIZER.vocab_size, "width": 32,
                  "heads": 2, "layers": 1},
    ).eval()  # fmt: skip


BACKBONES = {  # models that return embeddings: their targets come from vk.targets
    "timm backbone": (
        lambda: timm.create_model(
            representatives.FAMILIES["vision_transformer"].model,
            **{**representatives.FAMILIES["vision_transformer"].kwargs, "num_classes": 0},
        ),
        64,
    ),
    "Dinov2Model": (lambda: transformers.Dinov2Model(transformers.Dinov2Config(**_SMALL)), 32),
    "open_clip image tower": (lambda: vk.models.image_tower(_open_clip(32)), 32),
}


def cases() -> list:
    params = [
        pytest.param(m.build, m.size, False, id=f"{library}:{name}")
        for library, models in representatives.LIBRARIES.items()
        for name, m in models.items()
    ]
    for family in TIMM:
        r = representatives.FAMILIES[family]
        params.append(pytest.param(lambda r=r: timm.create_model(r.model, **r.kwargs), r.size,
                                   False, id=family))  # fmt: skip
    params += [pytest.param(make, size, True, id=name)
               for name, (make, size) in BACKBONES.items()]  # fmt: skip
    return params


def _concepts(count: int, size: int) -> vk.concepts.Concepts:
    """Three concept regions (the left half, the top half, the centre), concept k present in
    image i where i + k is even: each image holds some, each concept some images."""
    masks = torch.zeros(count, 3, size, size, dtype=torch.bool)
    masks[:, 0, :, : size // 2] = True
    masks[:, 1, : size // 2] = True
    masks[:, 2, size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = True
    present = (torch.arange(count)[:, None] + torch.arange(3)) % 2 == 0
    return vk.concepts.Concepts(NAMES, masks & present[:, :, None, None])


def _noise(count: int, size: int, seed: int) -> torch.Tensor:
    return torch.randn(count, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _dissected(found, units: int, names: list[str] = NAMES) -> None:
    """A dissection (or CLIP-Dissect) of ``units`` units against ``names``."""
    scores = found.iou if hasattr(found, "iou") else found.similarity
    assert scores.shape == (units, len(names)) and len(found.units) == units
    assert set(found.labels) <= set(names) and bool(torch.isfinite(scores).all())


def _named(checked, units: int) -> None:
    """`check_names`' result: each unit's concept in 2 of the 4 held-out images, so an AUC."""
    assert checked.held_out_auc.shape == (units,) and checked.positives.tolist() == [2] * units
    assert bool(((checked.held_out_auc >= 0) & (checked.held_out_auc <= 1)).all())


def _probed(probes, units: int) -> None:
    assert probes.weights.shape == (units, 2) and probes.best.shape == (2,)
    assert probes.ap.shape == (2,) and probes.purity.shape == (2, 1)
    assert bool(torch.isfinite(probes.test_loss).all()) and probes.probe_r <= 1


def _conditioned(result, x: torch.Tensor, units: int, chosen: int) -> None:
    """Maps of the right shapes whose units and rest add up to the whole (every method is
    linear in the layer's gradient). In float32 only up to rounding: a latent's rest is the
    stream less the latent's part, which AttnLRP's rules may make large and cancel (Swin's
    latents: 4e-4 of the largest value, 2e-15 in float64)."""
    b, _, h, w = x.shape
    assert result.maps.shape == (b, chosen, h, w) and result.rest.shape == (b, h, w)
    assert result.relevance.shape == (b, units) and bool(torch.isfinite(result.total).all())
    scale = float(result.total.abs().max())
    assert scale > 0
    torch.testing.assert_close(result.maps.sum(1) + result.rest, result.total, rtol=0,
                               atol=5e-3 * scale)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("make", "size", "backbone"), cases())
def test_concept_methods_on_each_family(make, size, backbone, tmp_path):
    model = drawn(make).train()
    x, held = coverage._images(model, size), _noise(4, size, 1)
    concepts, held_concepts = _concepts(4, size), _concepts(4, size)
    first = next(n for n in vk.HookedModel(model).hook_names() if n.endswith("hook_resid_post"))
    if refuses_videos(model, lambda: vk.concepts.dissect(model, x, concepts, first,
                                                         progress=False)):  # fmt: skip
        return
    with torch.no_grad():  # transformers' DPT installs its own output-capturing hooks on its
        model.eval()(x)  # first forward, for good: the state compared is after them
    model.train()
    before = full_state(model)
    hm = vk.HookedModel(model)
    layer = token_stream_layers(hm, (size, size))[0]  # the first block's output
    store = vk.cache_activations(model, x, tmp_path / "s", layers=[layer], progress=False)
    width = store.width
    sae = vk.train_sae(store, expansion=1, k=2, tokens=4 * len(store),
                       batch_size=min(32, len(store)), progress=False)  # fmt: skip

    # Network Dissection: the channels, the latents, and both read from the store
    found = vk.concepts.dissect(model, x, concepts, layer, quantile=0.05, progress=False)
    _dissected(found, width)
    latents = vk.concepts.dissect(model, x, concepts, sae, quantile=0.05, progress=False)
    _dissected(latents, sae.latents)
    for units, ran in ((layer, found), (sae, latents)):
        read = vk.concepts.dissect(model, None, concepts, units, quantile=0.05, progress=False,
                                   store=store)  # fmt: skip
        torch.testing.assert_close(read.thresholds, ran.thresholds, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(read.iou, ran.iou, rtol=1e-4, atol=1e-4)
    # the names checked on held-out images
    _named(vk.concepts.check_names(model, found, held, held_concepts, progress=False), width)
    _named(vk.concepts.check_names(model, latents, held, held_concepts, units=sae,
                                   progress=False), sae.latents)  # fmt: skip
    # CLIP-Dissect, named by an open_clip CLIP on the same images
    named = vk.concepts.clip_dissect(model, x, TEXTS, layer, _open_clip(size), TOKENIZER,
                                     progress=False)  # fmt: skip
    _dissected(named, width, TEXTS)
    # saev's probes on patch labels (a checkerboard of two classes on the layer's grid)
    grid = hm.token_layout((size, size), layer).grid
    board = (torch.arange(grid[0])[:, None] + torch.arange(grid[1])) % 2
    labels = vk.concepts.PatchLabels(["even", "odd"], board.expand(4, -1, -1).clone())
    for units, count in ((layer, width), (sae, sae.latents)):
        _probed(vk.concepts.probe_units(model, units, x, labels, held, labels, steps=5,
                                        purity_k=(2,), progress=False), count)  # fmt: skip

    # the methods that explain a target: a class, or on a backbone an embedding's norm
    target = vk.targets.embedding_norm() if backbone else 0
    if is_dense(model):  # per-pixel logits, or a promptable model's masks
        promptable = isinstance(model, PromptedMasks)
        target = vk.targets.mask_logit() if promptable else vk.targets.segment(1)
    concept, randoms = x[:2] + 1, [_noise(2, size, 2), _noise(2, size, 3)]
    tcav = vk.concepts.tcav(model, x, target, layer, concept, randoms)
    assert tcav.scores.shape == (2,) and tcav.sensitivities.shape == (2, 4)
    assert bool(((tcav.scores >= 0) & (tcav.scores <= 1)).all())
    crafted = vk.concepts.craft(model, x[:2], target, layer, concepts=2, designs=2,
                                progress=False)  # fmt: skip
    assert crafted.bank.shape == (2, width) and crafted.image_importance.shape == (2, 2)
    assert bool(torch.isfinite(crafted.importance).all() and (crafted.importance >= 0).all())
    maps = vk.concepts.concept_maps(model, crafted, x[:2])
    assert maps.shape == (2, 2, *grid)
    _conditioned(vk.concepts.conditioned_maps(model, x[:2], target, layer, chosen=[0, 1]),
                 x[:2], width, 2)  # fmt: skip
    _conditioned(vk.concepts.conditioned_maps(model, x[:2], target, sae, chosen=[0]), x[:2],
                 sae.latents, 1)  # fmt: skip
    if backbone:  # a class index on embeddings is refused, naming the targets to use
        for method in (
            lambda: vk.concepts.tcav(model, x, 0, layer, concept, randoms),
            lambda: vk.concepts.craft(model, x[:2], 0, layer, concepts=2, progress=False),
            lambda: vk.concepts.conditioned_maps(model, x, 0, layer, chosen=[0]),
        ):
            with pytest.raises(ValueError, match=r"is a backbone.*vk\.targets\.embedding_norm"):
                method()
    assert_full_state(model, before)
    assert model.training


def test_a_model_without_a_token_stream_is_refused_by_name(tmp_path):
    """A CNN (timm's ResNet) has no token stream: every method that reads units of one refuses
    its feature maps, saying so; TCAV, which flattens any activation, runs on them."""
    r = representatives.FAMILIES["resnet"]
    model = drawn(lambda: timm.create_model(r.model, **r.kwargs)).train()
    x, layer = coverage._images(model, r.size), "layer1.0.hook_out"  # (B, C, H, W)
    concepts = _concepts(4, r.size)
    before = full_state(model)
    with pytest.raises(ValueError, match="token"):
        vk.cache_activations(model, x, tmp_path / "s", progress=False)
    labels = vk.concepts.PatchLabels(["a", "b"], torch.zeros(4, 4, 4, dtype=torch.long))
    for method in (
        lambda: vk.concepts.dissect(model, x, concepts, layer, progress=False),
        lambda: vk.concepts.clip_dissect(model, x, TEXTS, layer, _open_clip(r.size), TOKENIZER,
                                         progress=False),
        lambda: vk.concepts.probe_units(model, layer, x, labels, x, labels, progress=False),
        lambda: vk.concepts.craft(model, x[:2], 0, layer, concepts=2, progress=False),
        lambda: vk.concepts.conditioned_maps(model, x, 0, layer, chosen=[0]),
    ):  # fmt: skip
        with pytest.raises(ValueError, match="not a token stream"):
            method()
    randoms = [_noise(2, r.size, 2), _noise(2, r.size, 3)]
    tcav = vk.concepts.tcav(model, x, 0, layer, x[:2] + 1, randoms)
    assert tcav.scores.shape == (2,) and tcav.sensitivities.shape == (2, 4)
    assert_full_state(model, before)
