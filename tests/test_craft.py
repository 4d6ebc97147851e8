"""CRAFT (`vizkit.concepts.craft`): the crops and the factorization against scikit-learn's NMF
on activations read here, the concept maps against ``NMF.transform``, the Halton designs and
Jansen's estimator against a hand computation and an analytic function, the perturbed forward
(unmasked: the model's logits; concepts off: a hand-made edit), the importance against a hand
computation, a planted concept found most important, the model left as it was, refusals and
the result's round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_full_state, build, full_state, patch_mean_vit
from scipy.stats import qmc
from sklearn.decomposition import NMF
from torch import nn

import vizkit as vk
from vizkit.analysis.result import Result
from vizkit.concepts.craft import (
    Craft,
    concept_maps,
    craft,
    jansen_total_indices,
    perturbed_logits,
    sobol_designs,
)
from vizkit.hooks import HookedModel

STREAM = "blocks.1.hook_resid_post"  # a block's output: the forward resumes there
HIDDEN = "blocks.1.mlp.act.hook_out"  # an MLP's hidden layer: the whole model runs
SIDE, CROP, STRIDE = 64, 32, 25  # test_vit's images, the default crop (half) and its stride
CONCEPTS, DESIGNS = 4, 8

# Xplique's NMF settings stop at 200 iterations on these activations; so does the reference here
pytestmark = pytest.mark.filterwarnings("ignore:Maximum number of iterations")


def _images(count: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def fitted():
    """test_vit, six images and CRAFT of STREAM on them (class 3)."""
    model, _ = build("vit")
    images = _images(6)
    result = craft(model, images, 3, STREAM, concepts=CONCEPTS, designs=DESIGNS,
                   progress=False)  # fmt: skip
    return model, images, result


def _tokens(model: nn.Module, images: torch.Tensor, layer: str) -> torch.Tensor:
    """(B, Np, C) ``layer``'s patch tokens on ``images`` (one class token first)."""
    with torch.no_grad():
        _, cache = HookedModel(model).run_with_cache(images, [layer])
    return cache[layer][:, 1:]


def _reference_nmf(model: nn.Module, images: torch.Tensor, layer: str, concepts: int):
    """Xplique's factorization, made here: the crops (an unfold of stride int(0.8 side)),
    resized back, their positive activations averaged over the patch tokens, scikit-learn's
    NMF of them (its nndsvda initialisation takes a randomized SVD: random_state=craft's seed,
    0). (the fitted NMF, U)."""
    crops = F.unfold(images, kernel_size=CROP, stride=STRIDE)  # (B, 3 CROP², L)
    crops = crops.transpose(1, 2).reshape(-1, 3, CROP, CROP)
    crops = F.interpolate(crops, size=(SIDE, SIDE), mode="bilinear", align_corners=False)
    pooled = _tokens(model, crops, layer).clamp_min(0).mean(1)
    reducer = NMF(n_components=concepts, alpha_W=1e-2, random_state=0)
    return reducer, reducer.fit_transform(pooled.numpy())


def test_crops_and_factorization_are_scikit_learns_nmf(fitted):
    model, images, result = fitted
    reducer, u = _reference_nmf(model, images, STREAM, CONCEPTS)
    corners = [[b, t, s] for b in range(6) for t in (0, 25) for s in (0, 25)]
    assert result.crops.tolist() == corners and result.options["stride"] == STRIDE
    assert result.bank.shape == (CONCEPTS, 64) and result.crop_coefficients.shape == (24, CONCEPTS)
    torch.testing.assert_close(result.bank, torch.from_numpy(reducer.components_),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    torch.testing.assert_close(result.crop_coefficients, torch.from_numpy(u), rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    assert (result.bank >= 0).all() and result.bank.max() > 0
    assert result.options["nmf_iterations"] == reducer.n_iter_


def test_concept_maps_are_scikit_learns_transform(fitted):
    model, images, result = fitted
    reducer, _ = _reference_nmf(model, images, STREAM, CONCEPTS)
    for x in (images, _images(3, seed=7)):  # the images fitted on, and new ones
        tokens = _tokens(model, x, STREAM).clamp_min(0)  # (B, 16, C)
        want = reducer.transform(tokens.flatten(0, 1).numpy())  # (B 16, R)
        want = torch.from_numpy(want).view(len(x), 4, 4, CONCEPTS).permute(0, 3, 1, 2)
        maps = concept_maps(model, result, x)
        assert maps.shape == (len(x), CONCEPTS, 4, 4) and maps.dtype == torch.float32
        torch.testing.assert_close(maps, want, rtol=1e-5, atol=1e-6)
        assert maps.amax() > 0


def test_halton_designs_and_jansen_estimator_against_a_hand_computation():
    concepts, designs = 3, 32
    points = qmc.Halton(d=2 * concepts, scramble=False).random(designs).astype(np.float32)
    a, b = points[:, :concepts], points[:, concepts:]
    replicated = []
    for i in range(concepts):
        c = a.copy()
        c[:, i] = b[:, i]
        replicated.append(c)
    want = torch.from_numpy(np.concatenate([a, b, *replicated]))
    masks = sobol_designs(concepts, designs)
    assert masks.shape == (designs * (concepts + 2), concepts) and torch.equal(masks, want)

    f = torch.randn(len(masks), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    fa, fc = f[:designs].numpy(), f[2 * designs :].view(concepts, designs).numpy()
    by_hand = ((fa - fc) ** 2).sum(1) / (2 * designs * np.var(fa, ddof=1))
    np.testing.assert_allclose(jansen_total_indices(f, designs).numpy(), by_hand, rtol=1e-12)

    # f = u1 + 0 u2: u2's total index is 0 exactly, u1's is 1 up to the design's error
    masks = sobol_designs(2, designs)
    total = jansen_total_indices(masks[:, 0] + 0 * masks[:, 1], designs)
    assert total[1] == 0 and abs(total[0] - 1) < 0.15, total
    # f = u1 u2 + u2: both matter, u2 more
    total = jansen_total_indices(masks[:, 0] * masks[:, 1] + masks[:, 1], designs)
    assert total[1] > total[0] > 0.05, total
    # a constant: every index 0 (the variance floored, not divided by 0)
    assert torch.equal(jansen_total_indices(torch.ones(len(masks)), designs), torch.zeros(2))


def test_unmasked_forward_is_the_models_and_concepts_off_a_hand_edit(fitted):
    model, images, result = fitted
    hidden = craft(model, images, 3, HIDDEN, concepts=2, designs=2, progress=False)
    assert result.options["resumed"] is True and hidden.options["resumed"] is False
    with torch.no_grad():
        logits = model(images)
    for found, layer in ((result, STREAM), (hidden, HIDDEN)):
        concepts = len(found.bank)
        masks = torch.cat([torch.ones(1, concepts), torch.zeros(1, concepts)])
        got = perturbed_logits(model, found, images, masks, batch_size=4)
        assert got.shape == (6, 2, logits.shape[1])
        torch.testing.assert_close(got[:, 0], logits, rtol=0, atol=1e-5)
        # every concept off: each patch token's a - u W, u from scikit-learn's transform
        tokens = _tokens(model, images, layer)
        u = _transform(tokens.clamp_min(0), found.bank)  # (B, Np, R)
        edited = tokens - u @ found.bank

        def replace(value, *, name, edited=edited):
            value = value.clone()
            value[:, 1:] = edited
            return value

        with torch.no_grad(), HookedModel(model).hooks(fwd={layer: replace}):
            off = model(images)
        torch.testing.assert_close(got[:, 1], off, rtol=0, atol=1e-4)
        assert (off - logits).abs().max() > 1e-3  # the concepts carried something


def _transform(tokens: torch.Tensor, bank: torch.Tensor) -> torch.Tensor:
    """(B, Np, R) scikit-learn's NMF.transform of ``tokens`` (B, Np, C) with ``bank`` fixed."""
    reducer = NMF(n_components=len(bank), alpha_W=1e-2)
    reducer.components_, reducer.n_components_ = bank.numpy(), len(bank)
    reducer.n_features_in_ = bank.shape[1]
    u = reducer.transform(tokens.flatten(0, 1).numpy())
    return torch.from_numpy(u).view(*tokens.shape[:2], len(bank))


def test_importance_is_jansen_of_the_perturbed_logits_by_hand(fitted):
    model, images, result = fitted
    masks = sobol_designs(CONCEPTS, DESIGNS)  # (48, R)
    tokens = _tokens(model, images, STREAM)
    u = _transform(tokens.clamp_min(0), result.bank)
    totals = []
    for b in range(len(images)):
        perturbed = tokens[b] + (u[b] * (masks[:, None] - 1)) @ result.bank  # (48, Np, C)

        def replace(value, *, name, perturbed=perturbed):
            value = value.clone()
            value[:, 1:] = perturbed
            return value

        with torch.no_grad(), HookedModel(model).hooks(fwd={STREAM: replace}):
            f = model(images[b : b + 1].expand(len(masks), -1, -1, -1))[:, 3]
        fa, fc = f[:DESIGNS].double(), f[2 * DESIGNS :].double().view(CONCEPTS, DESIGNS)
        totals.append(((fa - fc) ** 2).sum(1) / (2 * DESIGNS * fa.var()))
    by_hand = torch.stack(totals).float()
    torch.testing.assert_close(result.image_importance, by_hand, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(result.importance, by_hand.mean(0), rtol=1e-3, atol=1e-4)
    assert result.order.tolist() == by_hand.mean(0).argsort(descending=True).tolist()
    assert result.table(2) == [(c, float(result.importance[c])) for c in result.order[:2]]


def _planted_vit() -> nn.Module:
    """A one-block ViT on 32 px images, patches of 8, whose stream channels 0-2 are the means of
    the image's channels over each patch and the others 0 (`patch_mean_vit`); its block's
    branches zeroed (the stream goes through as it is), no final norm, the logits read from
    the patch tokens' mean: class 0's is 4 x channel 0's, the others' 0."""
    model = patch_mean_vit(32, 8, means=3, zeros=13)
    with torch.no_grad():
        block = model.blocks[0]
        for linear in (block.attn.proj, block.mlp.fc2, model.head):
            linear.weight.zero_()
            linear.bias.zero_()
        model.head.weight[0, 0] = 4.0
    model.norm = nn.Identity()
    model.global_pool = "avg"
    return model.eval()


def _planted_images() -> tuple[torch.Tensor, torch.Tensor]:
    """Nine 32 px images of the class, each 16 px quadrant of one colour (red, green or blue;
    image i's quadrants: colours i, i + 1, i + 2 (mod 3) and red), each 8 px patch at a random
    brightness in [0.5, 1]: every image holds red, and each colour fills a whole crop (the
    top-left quadrant) of three images. (images, (9, 4, 4) the colour of each patch)."""
    generator = torch.Generator().manual_seed(0)
    quadrants = torch.tensor([[i % 3, (i + 1) % 3, (i + 2) % 3, 0] for i in range(9)])
    colour = quadrants.view(9, 2, 2).repeat_interleave(2, 1).repeat_interleave(2, 2)
    value = 0.5 + 0.5 * torch.rand(9, 4, 4, generator=generator)
    grid = F.one_hot(colour, 3).permute(0, 3, 1, 2).float() * value[:, None]  # (9, 3, 4, 4)
    return grid.repeat_interleave(8, 2).repeat_interleave(8, 3), colour


def test_a_planted_concept_is_the_most_important():
    model, (images, colour) = _planted_vit(), _planted_images()
    result = craft(model, images, 0, "blocks.0.hook_resid_post", concepts=3, patch_size=16,
                   progress=False)  # fmt: skip
    red = int(result.bank[:, 0].argmax())  # the concept that carries channel 0 (red)
    assert result.order[0] == red, result.importance
    others = result.importance[torch.arange(3) != red]
    assert result.importance[red] > 0.8 and others.max() < 0.05, result.importance
    assert result.options["resumed"] is True and result.options["crops"] == 36
    maps = concept_maps(model, result, images)[:, red]  # (9, 4, 4): on the red patches only
    assert maps[colour == 0].min() > 0
    assert maps[colour != 0].max() < 0.1 * maps[colour == 0].min(), maps


def test_the_model_is_left_as_it_was_after_a_call_and_a_refusal():
    model, _ = build("vit")
    model.train()
    images = _images(2)
    before = full_state(model)
    result = craft(model, images, 1, STREAM, concepts=2, designs=2, progress=False)
    concept_maps(model, result, images)
    perturbed_logits(model, result, images, torch.ones(1, 2))
    assert_full_state(model, before)
    with pytest.raises(ValueError, match="out of range"):
        craft(model, images, 5000, STREAM, concepts=2, designs=2, progress=False)
    with pytest.raises(ValueError, match="concepts must be at most 8"):
        craft(model, images, 1, STREAM, concepts=9, progress=False)
    assert_full_state(model, before)
    assert model.training


def test_refusals_name_the_fix(fitted):
    model, images, result = fitted
    x = images[:2]
    with pytest.raises(ValueError, match="not a token stream"):
        craft(model, x, 0, "blocks.0.attn.hook_pattern", progress=False)
    with pytest.raises(KeyError):
        craft(model, x, 0, "blocks.9.hook_resid_post", progress=False)
    with pytest.raises(TypeError, match="layer must be a hook name"):
        craft(model, x, 0, 3, progress=False)
    with pytest.raises(ValueError, match=r"patch_size must be an int in \[2, 64\]; got 65"):
        craft(model, x, 0, STREAM, patch_size=65, progress=False)
    with pytest.raises(ValueError, match=r"patch_size must be an int in \[2, 64\]; got 1"):
        craft(model, x, 0, STREAM, patch_size=1, progress=False)
    with pytest.raises(ValueError, match="concepts must be an int >= 1; got 0"):
        craft(model, x, 0, STREAM, concepts=0, progress=False)
    with pytest.raises(ValueError, match="Pass more images, a smaller patch_size or fewer"):
        craft(model, x, 0, STREAM, concepts=9, progress=False)
    with pytest.raises(ValueError, match="designs must be an int >= 2"):
        craft(model, x, 0, STREAM, designs=1, progress=False)
    with pytest.raises(TypeError, match="target must be the int index"):
        craft(model, x, 1.0, STREAM, progress=False)
    with pytest.raises(ValueError, match="Target class 5000 is out of range"):
        craft(model, x, 5000, STREAM, progress=False)
    with pytest.raises(TypeError, match="craft_result must be the Craft"):
        concept_maps(model, {"bank": result.bank}, x)
    other, _ = build("deit_distilled")  # 192 channels, not 64
    with pytest.raises(ValueError, match="pass the model .and layer. the concepts were found on"):
        concept_maps(other, result, x)
    with pytest.raises(ValueError, match=r"masks must be \(K, 4\)"):
        perturbed_logits(model, result, x, torch.ones(2, 3))
    with pytest.raises(ValueError, match="concept must be an int in"):
        result.best_crops(4)


def test_round_trip_and_crops(fitted):
    model, images, result = fitted
    data = json.dumps(result.to_dict(), allow_nan=False)
    back = Result.from_dict(json.loads(data))
    assert isinstance(back, Craft) and back.to_dict() == result.to_dict()
    assert back.image_size == (SIDE, SIDE) and back.layout == result.layout
    assert torch.equal(back.bank, result.bank) and back.table() == result.table()
    text = repr(result)
    assert text.startswith("Craft(") and "\n" not in text and len(text) < 600, text
    best = result.best_crops(0, k=3)
    column = result.crop_coefficients[:, 0]
    assert column[[result.crops.tolist().index(box) for box in best.tolist()]].tolist() == (
        column.sort(descending=True).values[:3].tolist()
    )
    pixels = back.crop_images(images, 0, k=3)
    b, t, s = best[0].tolist()
    assert pixels.shape == (3, 3, CROP, CROP)
    assert torch.equal(pixels[0], images[b, :, t : t + CROP, s : s + CROP])


def test_a_score_target_is_each_images_own_class_logit(fitted):
    """A per-image score target follows each image's perturbed copies: a probe reading logit 3
    of image 0 and logit 5 of image 1 (an identity weight on the (B, K) logits) gives each image
    the importance its class's int target gives it (the same crops, so the same bank); so does a
    callable on the logits."""
    model, images, _ = fitted
    x = images[:2]
    by_class = [craft(model, x, k, STREAM, concepts=2, designs=4, progress=False) for k in (3, 5)]
    probe = vk.targets.probe(torch.eye(1000), None, [3, 5])
    scored = craft(model, x, probe, STREAM, concepts=2, designs=4, progress=False)
    assert torch.equal(scored.bank, by_class[0].bank)
    want = torch.stack([by_class[0].image_importance[0], by_class[1].image_importance[1]])
    torch.testing.assert_close(scored.image_importance, want, rtol=1e-4, atol=1e-6)
    assert scored.options["target"] == "probe" and scored.options["resumed"] is True
    first = craft(model, x, lambda out: out[:, 3], STREAM, concepts=2, designs=4, progress=False)
    torch.testing.assert_close(first.image_importance, by_class[0].image_importance)


class _Features(nn.Module):
    """A backbone returning its embedding in a dict, as open_clip's dict output does."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, x: torch.Tensor) -> dict:
        return {"image_features": self.backbone(x)}


def test_a_backbone_through_an_embedding_target():
    """A timm backbone (num_classes=0) refuses a class and runs on ``embedding_norm()``: from
    the layer on where its output is a tensor, the whole model with the stream edited where it
    is a dict, the two alike."""
    model, _ = build("vit")
    model.reset_classifier(0)
    x = _images(2)
    norm = vk.targets.embedding_norm()
    with pytest.raises(ValueError, match=r"is a backbone.*embedding_norm\(\)"):
        craft(model, x, 0, STREAM, concepts=2, designs=4, progress=False)
    resumed = craft(model, x, norm, STREAM, concepts=2, designs=4, progress=False)
    wrapped = craft(_Features(model), x, norm, f"backbone.{STREAM}", concepts=2, designs=4,
                    progress=False)  # fmt: skip
    assert resumed.options["resumed"] is True and wrapped.options["resumed"] is False
    assert resumed.options["target"] == "embedding norm"
    torch.testing.assert_close(wrapped.image_importance, resumed.image_importance, rtol=1e-3,
                               atol=1e-5)  # fmt: skip
    assert bool((resumed.importance > 0).any())
