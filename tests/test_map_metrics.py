"""Metrics of issue 35 against independent implementations on the same model, images and maps:
Sparseness, Complexity, Relevance Mass and Rank Accuracy against Quantus 0.6; Average Drop and
Increase in Confidence against pytorch-grad-cam's DropInConfidence / IncreaseInConfidence (which
give max(0, Y - O) without the paper's division by Y); and each against its paper's formula on
maps where the answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from representatives import drawn, refuses_class_scores, representatives

import vizkit as vk
from vizkit import coverage
from vizkit.hooks.inputs import video_input
from vizkit.hooks.scores import model_logits

quantus = pytest.importorskip("quantus")


@pytest.fixture(scope="module")
def shapes():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    x, labels, masks = vk.datasets.load_sample()
    maps = vk.attnlrp(model, x[:6], target=labels[:6]).maps
    return model, x[:6], labels[:6], masks[:6], maps


def _quantus(metric, x, labels, maps, masks=None):
    """Quantus' scores of ``maps`` (B, H, W) given as (B, 1, H, W) attributions."""
    a = maps[:, None].double().numpy()
    s = None if masks is None else masks[:, None].numpy()
    scores = metric(model=None, x_batch=x.numpy(), y_batch=labels.numpy(), a_batch=a,
                    s_batch=s, channel_first=True)  # fmt: skip
    return torch.tensor(np.asarray(scores, dtype=np.float64))


def test_sparseness_and_complexity_equal_quantus(shapes):
    _, x, labels, _, maps = shapes
    sparse = _quantus(quantus.Sparseness(disable_warnings=True), x, labels, maps)
    torch.testing.assert_close(vk.metrics.sparseness(maps), sparse, rtol=1e-4, atol=1e-5)
    entropy = _quantus(quantus.Complexity(disable_warnings=True), x, labels, maps)
    torch.testing.assert_close(vk.metrics.complexity(maps), entropy, rtol=1e-5, atol=1e-6)


def test_sparseness_and_complexity_at_their_extremes():
    single = torch.zeros(2, 4, 4)
    single[:, 1, 2] = -3.0  # one pixel: |map|
    uniform = torch.full((2, 4, 4), 0.7)
    assert vk.metrics.sparseness(single).tolist() == pytest.approx([15 / 16] * 2)
    assert vk.metrics.sparseness(uniform).tolist() == pytest.approx([0.0] * 2, abs=1e-12)
    assert vk.metrics.complexity(single).tolist() == pytest.approx([0.0] * 2)
    assert vk.metrics.complexity(uniform).tolist() == pytest.approx([math.log(16)] * 2)
    with pytest.raises(ValueError, match="all zero"):
        vk.metrics.sparseness(torch.zeros(1, 4, 4))
    with pytest.raises(ValueError, match="NaN"):
        vk.metrics.complexity(torch.full((1, 4, 4), float("nan")))


def test_relevance_mass_and_rank_accuracy_equal_quantus(shapes):
    _, x, labels, masks, maps = shapes
    pixels = F.interpolate(maps[:, None], size=masks.shape[-2:], mode="bilinear")[:, 0]
    positive = pixels.clamp_min(0)  # Arras et al. count positive relevance
    mass = _quantus(quantus.RelevanceMassAccuracy(disable_warnings=True), x, labels, positive,
                    masks)  # fmt: skip
    torch.testing.assert_close(vk.metrics.relevance_mass_accuracy(maps, masks).double(), mass,
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    rank = _quantus(quantus.RelevanceRankAccuracy(disable_warnings=True), x, labels, pixels,
                    masks)  # fmt: skip
    torch.testing.assert_close(vk.metrics.relevance_rank_accuracy(maps, masks).double(), rank)


def test_average_drop_and_increase_in_confidence_equal_pytorch_grad_cam(shapes):
    from pytorch_grad_cam.metrics.cam_mult_image import DropInConfidence, IncreaseInConfidence
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    model, x, labels, _, maps = shapes
    drop = vk.metrics.average_drop(model, x, maps, target=labels)
    increase = vk.metrics.increase_in_confidence(model, x, maps, target=labels)
    scaled = (maps - maps.amin((1, 2), keepdim=True)) / (
        maps.amax((1, 2), keepdim=True) - maps.amin((1, 2), keepdim=True)
    )
    cams = F.interpolate(scaled[:, None], size=x.shape[-2:], mode="bilinear")[:, 0].numpy()
    targets = [ClassifierOutputSoftmaxTarget(int(c)) for c in labels]
    with torch.no_grad():
        full = model(x).softmax(-1).gather(1, labels[:, None])[:, 0]
    theirs = torch.from_numpy(DropInConfidence()(x, cams, targets, model)).flatten()
    torch.testing.assert_close(drop * full, theirs, rtol=1e-4, atol=1e-6)
    theirs = torch.from_numpy(IncreaseInConfidence()(x, cams, targets, model)).flatten()
    torch.testing.assert_close(increase, theirs)
    assert ((drop >= 0) & (drop <= 1)).all()


def test_confidence_metrics_refuse_bad_maps(shapes):
    model, x, labels, _, maps = shapes
    with pytest.raises(ValueError, match="constant"):
        vk.metrics.average_drop(model, x, torch.ones_like(maps), target=labels)
    with pytest.raises(ValueError, match="do not tile"):
        vk.metrics.increase_in_confidence(model, x, torch.rand(6, 5, 5), target=labels)
    with pytest.raises(ValueError, match="out of range"):
        vk.metrics.average_drop(model, x, maps, target=99)


class _Linear(torch.nn.Module):
    """logits = (w . x) k: the drop when units go to 0 is exactly the sum of w * x there."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 8, 8))
        self.k = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return (x * self.w).sum((1, 2, 3))[:, None] * self.k


def test_faithfulness_correlation_is_one_for_the_exact_attribution():
    """Bhatt et al.'s definition: on a linear model with a zero baseline, gradient x input
    summed over a subset is the subset's drop, so the correlation is 1; random maps are not."""
    torch.manual_seed(0)
    model, x = _Linear().eval(), torch.randn(3, 3, 8, 8)
    exact = ((x * model.w).sum(1) * model.k[1]).detach()
    score = vk.metrics.faithfulness_correlation(
        model, x, exact, target=1, level="pixel", score="logit", runs=20
    )
    torch.testing.assert_close(score, torch.ones(3))
    noise = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(1))
    random = vk.metrics.faithfulness_correlation(
        model, x, noise, target=1, level="pixel", score="logit", runs=200
    )
    assert (random.abs() < 0.3).all()
    with pytest.raises(ValueError, match="fraction"):
        vk.metrics.faithfulness_correlation(model, x, exact, target=1, level="pixel", fraction=1)


def test_faithfulness_correlation_on_a_vit_ranks_attnlrp_above_random(shapes):
    model, x, labels, _, maps = shapes
    ours = vk.metrics.faithfulness_correlation(model, x, maps, target=labels, runs=30)
    noise = torch.rand(maps.shape, generator=torch.Generator().manual_seed(0))
    chance = vk.metrics.faithfulness_correlation(model, x, noise, target=labels, runs=30)
    assert ours.nanmean() > chance.nanmean() + 0.2


def test_max_sensitivity_follows_its_definition():
    """A method whose map is the image's channel mean changes by the noise's channel mean:
    max over the draws of ||mean_c(delta)|| / ||mean_c(x)||. A linear model's gradient does
    not change at all."""
    torch.manual_seed(0)
    model, x = _Linear().eval(), torch.randn(2, 3, 8, 8)

    def channel_mean(model, images, targets):
        return vk.SaliencyResult(images.mean(1), "mean", (8, 8), targets=targets)

    ours = vk.metrics.max_sensitivity(model, x, channel_mean, target=1, radius=0.1,
                                      samples=5, seed=3)  # fmt: skip
    generator = torch.Generator().manual_seed(3)
    noise = (torch.rand((5, *x.shape), generator=generator) * 2 - 1) * 0.1
    change = noise.mean(2).flatten(2).norm(dim=-1).amax(0)
    torch.testing.assert_close(ours, change / x.mean(1).flatten(1).norm(dim=-1))
    steady = vk.metrics.max_sensitivity(model, x, "saliency", target=1, samples=3)
    assert steady.abs().max() < 1e-6
    with pytest.raises(KeyError, match="known"):
        vk.metrics.max_sensitivity(model, x, "lime")


def test_noisy_linear_imputation_equals_pytorch_grad_cams_solver():
    """Without noise, each removed pixel is the 1/6-1/12 weighted mean of its neighbours,
    solved jointly: pytorch-grad-cam solves the same sparse system directly (scipy)."""
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer

    from vizkit.metrics.road import noisy_linear_imputation

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 12, 10, generator=generator)
    removed = (
        torch.rand(3, 12, 10, generator=generator) < torch.tensor([0.2, 0.6, 0.9])[:, None, None]
    )
    ours = noisy_linear_imputation(x, removed, noise=0.0)
    theirs = torch.stack([NoisyLinearImputer(noise=0.0)(x[i], (~removed[i]).float())
                          for i in range(3)])  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    assert torch.equal(ours[~removed[:, None].expand_as(x)], x[~removed[:, None].expand_as(x)])
    noisy = noisy_linear_imputation(x, removed, noise=0.01, generator=generator)
    assert 0.005 < (noisy - ours)[removed[:, None].expand_as(x)].std() < 0.015
    with pytest.raises(ValueError, match="every pixel"):
        noisy_linear_imputation(x[:1], torch.ones(1, 12, 10, dtype=torch.bool))


def test_road_equals_pytorch_grad_cam_at_one_fraction(shapes):
    """MoRF removing the top quarter of 32 x 32 pixels (pytorch-grad-cam's 75th percentile
    keeps the same 768), no noise: the same probabilities."""
    from pytorch_grad_cam.metrics.perturbation_confidence import (
        PerturbationConfidenceMetric,
        RemoveLeastRelevantFirst,
        RemoveMostRelevantFirst,
    )
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    model, x, labels, _, maps = shapes
    pixels = F.interpolate(maps[:, None], size=x.shape[-2:], mode="bilinear")[:, 0]
    targets = [ClassifierOutputSoftmaxTarget(int(c)) for c in labels]
    with torch.no_grad():
        full = model(x).softmax(-1).gather(1, labels[:, None])[:, 0]
    for order, remove, percentile in (("morf", RemoveMostRelevantFirst, 75),
                                      ("lerf", RemoveLeastRelevantFirst, 75)):  # fmt: skip
        metric = PerturbationConfidenceMetric(remove(percentile, NoisyLinearImputer(noise=0.0)))
        change = torch.from_numpy(metric(x, pixels.numpy(), targets, model)).flatten()
        ours = vk.metrics.road(model, x, maps, target=labels, order=order, fractions=(0.25,),
                               noise=0.0)  # fmt: skip
        torch.testing.assert_close(ours.scores[:, 0], full + change, rtol=1e-4, atol=1e-5)
    curve = vk.metrics.road(model, x, maps, target=labels)
    assert curve.kind == "road_morf" and curve.scores.shape == (6, 9)
    with pytest.raises(ValueError, match="increasing"):
        vk.metrics.road(model, x, maps, fractions=(0.5, 0.2))


def test_deletion_lerf_removes_the_least_salient_units_first(shapes):
    """LeRF deletion at each step zeroes the k least salient patches (checked against a
    forward of those images built here), and is MoRF deletion of the negated map."""
    model, x, labels, _, maps = shapes
    lerf = vk.metrics.deletion(model, x, maps, labels, steps=4, order="lerf", progress=False)
    assert lerf.kind == "deletion_lerf" and lerf.options["order"] == "lerf"
    side = lerf.options["unit"][0]  # AttnLRP's pixel maps, scored per 4 x 4 patch
    cells = F.avg_pool2d(maps[:, None], side)[:, 0]
    units = cells[0].numel()
    for step, fraction in enumerate(lerf.fractions.tolist()[1:-1], start=1):
        count = math.ceil(fraction * units - 1e-6)
        least = cells.flatten(1).argsort(1)[:, :count]
        keep = torch.ones(len(x), units).scatter_(1, least, 0.0).view_as(cells)
        kept = x * keep.repeat_interleave(side, -2).repeat_interleave(side, -1)[:, None]
        with torch.no_grad():
            expected = model(kept).softmax(-1).gather(1, labels[:, None])[:, 0]
        torch.testing.assert_close(lerf.scores[:, step], expected)
    morf = vk.metrics.deletion(model, x, -maps, labels, steps=4, progress=False)
    torch.testing.assert_close(lerf.scores, morf.scores)
    faithful = vk.metrics.deletion(model, x, maps, labels, steps=4, progress=False)
    assert (lerf.auc > faithful.auc).float().mean() > 0.5  # AttnLRP's least relevant matter less
    with pytest.raises(ValueError, match="order"):
        vk.metrics.deletion(model, x, maps, labels, order="random", progress=False)


def _model_metrics(maps):
    return {
        "average_drop": lambda m, x: vk.metrics.average_drop(m, x, maps),
        "increase_in_confidence": lambda m, x: vk.metrics.increase_in_confidence(m, x, maps),
        "faithfulness_correlation": lambda m, x: vk.metrics.faithfulness_correlation(
            m, x, maps, runs=4),
        "road": lambda m, x: vk.metrics.road(m, x, maps, fractions=(0.5,)).scores,
        "max_sensitivity": lambda m, x: vk.metrics.max_sensitivity(m, x, "saliency", samples=2),
        "sanity_check": lambda m, x: vk.sanity_check(m, x, "saliency", progress=False).maps,
    }  # fmt: skip


@pytest.mark.parametrize("metric", list(_model_metrics(None)))
def test_metrics_follow_the_input_contract(metric):
    """NaN images are refused; a model in train mode is scored in eval mode and left in train
    mode, its parameters without gradients."""
    from conftest import build

    model, x = build("vit")
    maps = torch.rand(2, 4, 4, generator=torch.Generator().manual_seed(0))
    run = _model_metrics(maps)[metric]
    bad = x.clone()
    bad[1, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        run(model, bad)
    expected = run(model.eval(), x)
    model.train()
    torch.testing.assert_close(run(model, x), expected, equal_nan=True)
    assert model.training and all(p.grad is None for p in model.parameters())


def _metrics_on_clips(model, x):
    """A video model's clips x (2, T, C, H, W): the metrics that take clips score a map of every
    frame (2, T, H, W) with finite values in their ranges; the others refuse clips by name."""
    frames, side = x.shape[1], x.shape[-1]
    grid = torch.linspace(-1, 1, side)
    still = -(grid[:, None] ** 2 + grid[None] ** 2)
    maps = torch.stack([still + t * grid[None] for t in range(frames)])[None].repeat(2, 1, 1, 1)
    maps[1] = maps[1].flip(-2)  # two different clips' maps, each frame its own
    masks = maps > maps.flatten(1).median(1).values[:, None, None, None]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    scores = {
        "deletion": vk.metrics.deletion(model, x, maps, steps=2, progress=False).auc,
        "insertion": vk.metrics.insertion(model, x, maps, steps=2, progress=False).auc,
        "relevance_mass_accuracy": vk.metrics.relevance_mass_accuracy(maps, masks),
    }
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    for name, values in scores.items():
        assert values.shape == (2,) and bool(((values >= 0) & (values <= 1)).all()), name
    for call in (
        lambda: vk.metrics.road(model, x, maps, fractions=(0.5,)),
        lambda: vk.metrics.average_drop(model, x, maps),
        lambda: vk.metrics.faithfulness_correlation(model, x, maps, runs=2),
        lambda: vk.metrics.max_sensitivity(model, x, "saliency", samples=2),
    ):
        with pytest.raises(ValueError, match=r"\(\) does not take videos yet"):
            call()


@pytest.mark.slow
@pytest.mark.parametrize(("make", "size"), representatives())
def test_every_metric_runs_on_every_family(make, size):
    """On each representative of docs/coverage.md, every metric of `vk.evaluate` scores a
    smooth map (its coarse options: one ROAD share, two deletion steps) with finite values in
    their ranges (faithfulness correlation NaN, as documented, where the model's output does not
    depend on its input), and the model's parameters are unchanged."""
    model = drawn(make)
    x = coverage._images(model, size)[:2]
    if video_input(model) is not None:
        _metrics_on_clips(model, x)
        return
    if refuses_class_scores(model, lambda: vk.metrics.deletion(model, x, x[:, :, 0, 0], steps=2)):
        return
    side = x.shape[-1]
    grid = torch.linspace(-1, 1, side)
    maps = (-(grid[:, None] ** 2 + grid[None] ** 2)).expand(2, side, side).clone()
    maps[1] = maps[1].flip(0) + grid[None]  # two different maps
    masks = maps > maps.flatten(1).median(1).values[:, None, None]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    scores = {
        "deletion": vk.metrics.deletion(model, x, maps, steps=2, progress=False).auc,
        "deletion_lerf": vk.metrics.deletion(model, x, maps, steps=2, order="lerf",
                                             progress=False).auc,
        "insertion": vk.metrics.insertion(model, x, maps, steps=2, progress=False).auc,
        "road": vk.metrics.road(model, x, maps, fractions=(0.5,)).scores[:, 0],
        "average_drop": vk.metrics.average_drop(model, x, maps),
        "increase_in_confidence": vk.metrics.increase_in_confidence(model, x, maps),
        "faithfulness_correlation": vk.metrics.faithfulness_correlation(
            model, x, maps, runs=4, score="logit"  # random CNNs' probabilities barely move
        ),
        "max_sensitivity": vk.metrics.max_sensitivity(model, x, "saliency", samples=2),
        "relevance_mass_accuracy": vk.metrics.relevance_mass_accuracy(maps, masks),
    }  # fmt: skip
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        logits = model_logits(model(x))
    if torch.allclose(logits[0], logits[1]):  # random BN CNNs whose output barely depends
        scores.pop("faithfulness_correlation")  # on the input: NaN where no drop varies
    for name, values in scores.items():
        assert values.shape == (2,) and torch.isfinite(values).all(), name
    probabilities = ("deletion", "deletion_lerf", "insertion", "road", "increase_in_confidence")
    assert all(bool(((scores[n] >= 0) & (scores[n] <= 1)).all()) for n in probabilities)
