"""One metric registry and one scoring loop: `compare_saliency` on a batch and `evaluate` over
the same images as a data set give the same per-image scores for every registered metric, a
metric registered with `vk.metrics.metric` is scored by both by name, and the names "quick"
and "all" mean one thing in both."""

from __future__ import annotations

import pytest
import torch

import vizkit as vk
from vizkit.metrics.registry import METRICS


@pytest.fixture(scope="module")
def shapes():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    x, labels, masks = vk.datasets.load_sample()
    # contiguous, as the data set's batches are: a channels-last copy takes other kernels,
    # whose last-bit differences can reorder Grad-CAM's tied zeros in ROAD's ranking
    return model, x[:6].contiguous(), labels[:6], masks[:6]


def test_one_batch_and_a_data_set_of_it_score_alike(shapes):
    model, x, labels, masks = shapes
    methods = ["gradcam", "random"]
    table = vk.compare_saliency(model, x, methods, masks=masks, target=labels, metrics="all",
                                steps=4, progress=False)  # fmt: skip
    evaluated = vk.evaluate(model, (x, labels, masks), methods, metrics="all", batch_size=6,
                            steps=4, progress=False)  # fmt: skip
    assert table.metrics == evaluated.metrics == list(METRICS)  # masks: every metric applies
    torch.testing.assert_close(table.per_image, evaluated.per_image, equal_nan=True)
    assert not table.per_image.isnan().all(-1).any()  # every metric scored some image
    quick = vk.compare_saliency(model, x, methods, masks=masks, target=labels, steps=4,
                                progress=False)  # fmt: skip
    assert quick.metrics == [m for m in METRICS if METRICS[m].quick]
    torch.testing.assert_close(
        quick.per_image, table.per_image[:, [table.metrics.index(m) for m in quick.metrics]]
    )


def test_a_registered_metric_is_scored_by_both_by_name(shapes):
    model, x, labels, _ = shapes

    @vk.metrics.metric("peak_share", higher=True, summary="the largest share of |map|")
    def peak_share(batch: vk.metrics.ScoredBatch) -> torch.Tensor:
        flat = batch.maps.abs().flatten(1)
        return flat.amax(1) / flat.sum(1)

    try:
        table = vk.compare_saliency(model, x, ["random"], target=labels, progress=False,
                                    metrics=["peak_share", "sparseness"])  # fmt: skip
        evaluated = vk.evaluate(model, (x, labels), ["random"], metrics="peak_share",
                                batch_size=3, progress=False)  # fmt: skip
        parts = zip(x.split(3), labels.split(3), strict=True)
        per_batch = [_peak_share(model, *part) for part in parts]
        torch.testing.assert_close(table.per_image[0, 0], _peak_share(model, x, labels))
        torch.testing.assert_close(evaluated.per_image[0, 0], torch.cat(per_batch))
        assert table.metrics == ["peak_share", "sparseness"] and "peak_share ↑" in str(table)
        with pytest.raises(ValueError, match="registered already"):
            vk.metrics.metric("peak_share", higher=True, summary="again")(lambda batch: None)
    finally:
        METRICS.pop("peak_share")


def _peak_share(model, x, labels):
    """(B,) the peak's share of |map| of the random maps of x (drawn per batch, as `evaluate`
    draws them batch by batch)."""
    flat = vk.random_saliency(model, x, target=labels).maps.abs().flatten(1)
    return (flat.amax(1) / flat.sum(1)).float()


def test_metric_names_are_checked_alike(shapes):
    model, x, labels, masks = shapes
    for score in (
        lambda metrics: vk.compare_saliency(model, x, ["random"], metrics=metrics),
        lambda metrics: vk.evaluate(model, (x, labels), ["random"], metrics=metrics),
    ):
        with pytest.raises(KeyError, match="Unknown metrics \\['accuracy'\\]"):
            score(["accuracy"])
        with pytest.raises(ValueError, match="need object masks"):
            score("pointing_game")
        with pytest.raises(ValueError, match="distinct"):
            score(["sparseness", "sparseness"])
    table = vk.compare_saliency(model, x, ["random"], metrics="quick", progress=False)
    assert table.metrics == ["deletion_auc", "insertion_auc"]  # no masks: no mask metric
