"""Figure builders draw what the results hold, with the stated colour scales and titles."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest
import timm
import torch

import vizkit as vk
from vizkit import viz


@pytest.fixture(scope="module")
def vit_and_images():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images, labels, masks = vk.datasets.load_sample()
    return model, images[:4], labels[:4], masks[:4]


def test_display_images_undo_the_normalization(vit_and_images):
    model, images, *_ = vit_and_images
    shown = viz.display_images(images, model)
    assert shown.shape == (4, 32, 32, 3) and shown.dtype == np.uint8
    mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
    pixel = images[0, :, 0, 0] * torch.tensor(std) + torch.tensor(mean)
    assert shown[0, 0, 0].tolist() == (pixel.clamp(0, 1) * 255).round().int().tolist()
    with pytest.raises(ValueError, match=r"\(B, 1 or 3, H, W\)"):
        viz.display_images(images[0], model)


def test_attention_grid_holds_every_layer_and_head(vit_and_images):
    model, images, *_ = vit_and_images
    result = vk.attention(model, images)
    fig = viz.attention_grid(result, image=1)
    heatmaps = [t for t in fig.data if isinstance(t, go.Heatmap)]
    assert len(heatmaps) == 4 * 4  # layers x heads
    expected = result.row("cls")[2, 1, 3]  # layer 2, image 1, head 3
    assert np.allclose(heatmaps[2 * 4 + 3].z, expected.numpy())
    assert all(t.coloraxis == "coloraxis" for t in heatmaps)  # one shared colour scale
    assert "class token" in fig.layout.title.text
    with pytest.raises(ValueError, match="out of range"):
        viz.attention_grid(result, image=9)


def test_attention_grid_colour_scales_and_square_cells(vit_and_images):
    model, images, *_ = vit_and_images
    result = vk.attention(model, images)
    rows = result.row("cls")[:, 0].float()
    robust = viz.attention_grid(result, scale="robust")
    assert robust.layout.coloraxis.cmax == pytest.approx(rows.quantile(0.99).item())
    assert viz.attention_grid(result, scale="shared").layout.coloraxis.cmax == pytest.approx(
        rows.max().item()
    )
    per_panel = viz.attention_grid(result, scale="per_panel")
    assert all(np.nanmax(t.z) == pytest.approx(1.0) for t in per_panel.data)
    for i, trace in enumerate(robust.data):  # every panel's y axis follows its own x axis
        axis = robust.layout["yaxis" + trace.yaxis[1:]]
        assert axis.scaleanchor == trace.xaxis, f"panel {i}"
    with pytest.raises(ValueError, match="scale must be one of"):
        viz.attention_grid(result, scale="log")


def test_saliency_figures_use_cividis_and_show_scores(vit_and_images):
    model, images, _, masks = vit_and_images
    table = vk.compare_saliency(model, images, ["rollout", "random"], masks=masks, steps=8)
    fig = viz.saliency_side_by_side(table, viz.display_images(images, model), image=1)
    assert fig.layout.coloraxis.colorscale[0][1] == "#00224e"  # cividis starts here
    titles = [a.text for a in fig.layout.annotations]
    assert any(t.startswith("<b>rollout</b>") and "point" in t for t in titles)
    assert fig.layout.sliders[0].currentvalue.prefix == "map opacity "
    opacity = fig.layout.sliders[0].steps[fig.layout.sliders[0].active].args[0]["opacity"][0]
    assert all(t.opacity == opacity for t in fig.data if isinstance(t, go.Heatmap))
    page = table._repr_html_()  # JupyterLab shows the table, not a pipe table
    assert page.startswith("<table") and "deletion_auc ↓" in page and "<td>rollout</td>" in page
    assert "IoU = mask_iou ↑" in _legend(fig) and "curves of 8 steps" in _legend(fig)


def test_saliency_legend_lists_only_the_computed_scores(vit_and_images):
    model, images, _, _ = vit_and_images
    table = vk.compare_saliency(model, images, ["rollout", "random"], steps=4, progress=False)
    fig = viz.saliency_side_by_side(table, viz.display_images(images, model))
    assert _legend(fig) == "del = deletion_auc ↓, ins = insertion_auc ↑ (curves of 4 steps)"
    titles = " ".join(a.text for a in fig.layout.annotations)
    assert "point" not in titles and "energy" not in titles and "IoU" not in titles


def _legend(fig: go.Figure) -> str:
    """The text under a side-by-side figure's panels."""
    return next(a.text for a in fig.layout.annotations if a.text.startswith("del = "))


def test_residual_ratio_curves_shade_epochs(vit_and_images):
    model, images, *_ = vit_and_images
    ratios = vk.residual_ratios(model, images)
    history = [ratios, ratios, ratios]
    fig = viz.residual_ratio_curves(history)
    with pytest.raises(TypeError, match="tracked_results"):
        viz.residual_ratio_curves([ratios.to_dict()])  # a history entry, not yet read back
    assert len(fig.data) == 2 * 3  # attention and FFN panels, one curve per epoch
    assert list(fig.data[0].y) == pytest.approx(ratios.attn.tolist())
    first, last = fig.data[0].line.color, fig.data[-2].line.color
    assert sum(map(int, first[4:-1].split(","))) > sum(map(int, last[4:-1].split(",")))  # darker


def test_residual_ratio_curves_say_what_the_models_have(vit_and_images, cait):
    """Titles and axis come from the results: no "with LayerScale" for a model without it, no
    class-attention note without a class-attention stage, and labelled models in a comparison."""
    model, images, *_ = vit_and_images
    plain = vk.residual_ratios(model, images)  # vit_tiny_shapes: no LayerScale
    fig = viz.residual_ratio_curves(plain)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["self-attention branch (no LayerScale)", "FFN branch (no LayerScale)"]
    assert fig.layout.xaxis2.title.text == "block"
    cait_model, x = cait
    scaled = vk.residual_ratios(cait_model, x)
    assert "with LayerScale" in viz.residual_ratio_curves(scaled).layout.annotations[0].text
    assert "class-attention" in viz.residual_ratio_curves(scaled).layout.xaxis2.title.text
    compared = viz.residual_ratio_curves({"ViT": plain, "CaiT": scaled})
    assert [t.name for t in compared.data if t.showlegend] == ["ViT", "CaiT"]
    assert "where the model has it" in compared.layout.annotations[0].text


def test_layerscale_heatmap_is_the_gammas(cait):
    model, _ = cait
    fig = viz.layerscale_heatmap(vk.analysis.layerscale(model))
    assert np.allclose(fig.data[0].z[1], model.blocks[1].gamma_1.detach().numpy())
    assert np.allclose(fig.data[1].z[-1], model.blocks_token_only[-1].gamma_2.detach().numpy())
    plain = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2)
    with pytest.raises(ValueError, match="no LayerScale"):
        vk.analysis.layerscale(plain)


def test_cka_and_feature_evolution_figures(vit_and_images):
    model, images, *_ = vit_and_images
    evolution = vk.feature_evolution(model, images.repeat(2, 1, 1, 1), progress=False)
    heat = viz.cka_heatmap(evolution.cka)
    assert np.allclose(heat.data[0].z, evolution.cka.matrix.numpy())
    assert list(heat.data[0].y) == [f"blocks.{i}" for i in range(4)]
    curves = viz.feature_evolution_curves({"a": evolution, "b": evolution})
    assert len(curves.data) == 4 and list(curves.data[0].y) == pytest.approx(
        evolution.curve.tolist()
    )


def test_mask_and_training_figures_check_inputs():
    mask = torch.arange(16.0).reshape(4, 4)
    fig = vk.papers.masks.mask_figure(mask, (2, 2), query=(1, 0))
    assert fig.data[1].z.tolist() == [[8.0, 9.0], [10.0, 11.0]]  # row of patch (1, 0) = token 2
    with pytest.raises(ValueError, match="must be"):
        vk.papers.masks.mask_figure(mask, (3, 3))
    with pytest.raises(ValueError, match="non-empty"):
        viz.training_curves([])
    card = vk.zoo.card("vit_tiny_shapes")
    curves = viz.epoch_accuracy_curves({"a": card["history"], "b": card["history"][:2]})
    assert [len(t.y) for t in curves.data] == [len(card["history"]), 2]
    assert curves.data[0].y[-1] == card["history"][-1]["test_accuracy"]
    with pytest.raises(ValueError, match="non-empty"):
        viz.epoch_accuracy_curves({"a": []})
    fig = viz.training_curves(card["history"])
    assert {t.name for t in fig.data} == {
        "train_loss",
        "test_loss",
        "train_accuracy",
        "test_accuracy",
    }


def test_refiner_figures_draw_every_stage_and_model():
    torch.manual_seed(0)
    model = timm.create_model("vizkit_refined_vit_tiny", depth=3, embed_dim=32).eval()
    x = torch.randn(2, 3, 32, 32)
    stages = vk.papers.refiner.refiner_stages(model, x, layer=1)
    fig = vk.papers.refiner.refiner_stages_figure(stages, image=1)
    heatmaps = [t for t in fig.data if isinstance(t, go.Heatmap)]
    assert len(heatmaps) == 4 + 12 + 12 + 4  # softmax, expanded, convolved, reduced
    assert np.allclose(heatmaps[-1].z, stages.maps["refined"][1, 3].numpy())
    assert len(vk.papers.refiner.refiner_weights_figure(stages).data) == 1 + 12 + 1
    applied = vk.attention(model, x, maps="applied")
    results = {"softmax": vk.attention(model, x), "applied": applied}
    fig = vk.papers.refiner.attention_matrices(results, layers=[0, 2])
    assert [t.coloraxis for t in fig.data] == ["coloraxis"] * 2 + ["coloraxis2"] * 2
    named = vk.papers.refiner.attention_matrices(results, layers=[-3, "blocks.2"])
    assert [t.z.tolist() for t in named.data] == [t.z.tolist() for t in fig.data]
    some = {"softmax": vk.attention(model, x, layers=[0, 2])}
    with pytest.raises(
        ValueError, match=r"Layer 1 \(blocks.1.attn.hook_pattern\) was not captured"
    ):
        vk.papers.refiner.attention_matrices(some, layers=[1])
    curves = vk.papers.refiner.attention_depth_curves({k: r.stats() for k, r in results.items()})
    assert len(curves.data) == 2 * 3
    seeds = {"a": {"mean": 0.5, "std": 0.1, "accuracies": [0.4, 0.6], "seeds": [0, 1]}}
    assert viz.accuracy_over_seeds_figure(seeds, "t").data[0].y == (0.5,)
    near_ceiling = {  # the axis spans the seeds and spreads (with a margin), not 0-100 %
        "a": {"mean": 0.978, "std": 0.004, "accuracies": [0.974, 0.978, 0.982], "seeds": [0, 1, 2]},
        "b": {"mean": 0.99, "std": float("nan"), "accuracies": [0.99], "seeds": [0]},
    }
    axis = viz.accuracy_over_seeds_figure(near_ceiling, "t").layout.yaxis.range
    assert axis == pytest.approx((0.969, 0.995))
    assert vk.papers.refiner.crop_ratio_curves({"m": {0.9: 0.5, 1.1: 0.6}}).data[0].x == (0.9, 1.1)


def test_predictions_name_classes_by_index_and_flag_near_chance(vit_and_images):
    model, images, labels, _ = vit_and_images
    shown = viz.display_images(images, model)
    sure = torch.full((4, 1000), -10.0)
    sure[torch.arange(4), torch.tensor([3, 999, 7, 500])] = 10.0
    names = [f"shape {k}" for k in range(10)]
    fig = viz.predictions_figure(shown, vk.metrics.predictions(sure, None, names))
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:2] == ["3 1.00", "999 1.00"]  # 10 names for 1000 classes: by index
    assert "10 class names for 1000 classes: classes shown by index" in fig.layout.title.text
    mixed = sure.clone()
    mixed[1:3] = 0.0  # images 1 and 2: a uniform softmax over 1000 classes
    fig = viz.predictions_figure(shown, vk.metrics.predictions(mixed, torch.tensor([3, 1, 2, 500])))
    titles = [a.text for a in fig.layout.annotations]
    assert "near chance" not in titles[0] + titles[3] and "green" in titles[0]
    for title in titles[1:3]:
        assert "near chance" in title and "(1/K 0.001)" in title and "true " in title
    assert "near chance on 2 of 4 images" in fig.layout.title.text
    with pytest.raises(ValueError, match=r"classes of the model, in 0\.\.9; got 0\.\.12"):
        vk.metrics.predictions(mixed[:, :10], torch.tensor([0, 12, 1, 2]))


def test_scale_trend_draws_each_budget_with_its_verdict_and_refuses_bad_points():
    points = [
        {"budget": "40 epochs", "value": -3.0, "two_se": 1.0, "verdict": "not held"},
        {"budget": "80 epochs", "value": 0.5, "two_se": 2.0, "verdict": "inconclusive"},
    ]
    fig = viz.scale_trend(points, "WordT minus ClassT")
    line = fig.data[0]
    assert line.x == ("40 epochs", "80 epochs") and line.y == (-3.0, 0.5)
    assert tuple(line.error_y.array) == (1.0, 2.0) and line.error_y.visible
    assert list(line.marker.color) == ["#e66101", "#7f7f7f"]
    assert list(line.marker.symbol) == ["circle", "circle"]
    assert [t.name for t in fig.data[1:]] == ["not held", "inconclusive"]
    mixed = viz.scale_trend([points[0], {**points[1], "two_se": float("nan")}], "t")
    assert list(mixed.data[0].marker.symbol) == ["circle", "circle-open"]
    assert mixed.data[0].customdata[1][1] == "spread unknown"
    one_run = viz.scale_trend([{**points[0], "two_se": float("nan")}], "t", unit="CV")
    assert one_run.data[0].error_y.visible is False
    assert "CV" in one_run.layout.yaxis.title.text
    with pytest.raises(ValueError, match="Unknown verdicts"):
        viz.scale_trend([{**points[0], "verdict": "maybe"}], "t")
    with pytest.raises(ValueError, match="finite"):
        viz.scale_trend([{**points[0], "value": float("nan")}], "t")
    with pytest.raises(ValueError, match="at least one"):
        viz.scale_trend([], "t")
    with pytest.raises(ValueError, match="drawn once"):
        viz.scale_trend([points[0], points[0]], "t")
    for bad in (-1.0, float("inf")):
        with pytest.raises(ValueError, match="two_se must be"):
            viz.scale_trend([{**points[0], "two_se": bad}], "t")


def test_a_method_keeps_its_colour_in_every_figure():
    """Grad-CAM is one colour in the bars, the curves and the sanity curves, whichever methods
    each figure holds and in whichever order."""
    from vizkit.metrics.faithfulness import CurveResult
    from vizkit.viz.style import method_color

    bars = vk.viz.evaluation_bars(
        vk.metrics.SaliencyTable(
            ["integrated_gradients", "gradcam", "random"],
            ["sparseness"],
            torch.rand(3, 1, 4),
            [1.0] * 3,
        )  # fmt: skip
    )
    fractions = torch.linspace(0, 1, 3)
    curve = CurveResult("deletion", fractions, torch.rand(4, 3), torch.rand(4), None)
    lines = vk.viz.curve_comparison({"random": curve, "gradcam": curve})
    bar_colors = dict(zip(bars.data[0].x, bars.data[0].marker.color, strict=True))
    line_colors = {t.legendgroup: t.line.color for t in lines.data if t.legendgroup}
    assert bar_colors["gradcam"] == line_colors["gradcam"] == method_color("gradcam")
    assert bar_colors["random"] == line_colors["random"] != bar_colors["gradcam"]
    assert method_color("my_method") == method_color("my_method")  # the user's own: stable


def test_curves_of_a_score_target_are_drawn_on_their_own_scale():
    """A backbone's curves track an embedding target's score (say a norm of 13), not a
    probability: the axis says so and spans the values."""
    from vizkit.metrics.faithfulness import CurveResult

    fractions = torch.linspace(0, 1, 3)
    scores = 13 + torch.rand(2, 3)
    curve = CurveResult("deletion", fractions, scores, scores.mean(1), None)
    fig = vk.viz.curve_comparison({"gradcam": curve})
    assert fig.layout.yaxis.title.text == "target score" and fig.layout.yaxis.range is None


def test_many_head_columns_are_titled_by_number():
    """24 heads at 900 px would run 'head 0 head 1 ...' together: beyond 8 the columns are
    titled by number and the figure's title says they are heads."""
    model = vk.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_heads=12,
                            embed_dim=48).eval()  # fmt: skip
    fig = vk.viz.attention_grid(vk.attention(model, torch.randn(1, 3, 32, 32)))
    titles = [a.text for a in fig.layout.annotations if a.text and a.textangle != 90]
    assert titles == [str(h) for h in range(12)] and "columns: heads" in fig.layout.title.text


@pytest.mark.parametrize("case", ["softmax", "applied", "query", "stages"])
def test_the_statistics_figure_draws_the_statistics_of_stats(case):
    """It computes only what it draws (entropy, distance, locality), equal to `stats()`'s."""
    torch.manual_seed(0)
    if case == "stages":
        model = timm.create_model(
            "swin_tiny_patch4_window7_224", img_size=112, depths=(2, 2, 2, 2), embed_dim=32,
            num_heads=(1, 2, 2, 4),
        ).eval()  # fmt: skip
        x = torch.randn(2, 3, 112, 112)
    else:
        model = timm.create_model("vizkit_refined_vit_tiny", depth=3, embed_dim=32).eval()
        x = torch.randn(2, 3, 32, 32)
    options = {"applied": {"maps": "applied"}, "query": {"query": "cls"}}.get(case, {})
    result = vk.attention(model, x, **options)
    stats = [s.stats() for s in (result if case == "stages" else [result])]
    means = [t for t in viz.attention_stats_figure(result).data if t.name == "mean"]
    keys = ["entropy"] if case == "query" else ["entropy", "distance_pixels", "locality"]
    assert len(means) == len(keys)
    for trace, key in zip(means, keys, strict=True):
        per_head = [st[key].float().mean(1) for st in stats]  # (L, H) per stage
        assert list(trace.y) == [v for p in per_head for v in p.mean(1).tolist()]


def test_fit_title_wraps_each_line_to_fit_its_width():
    from vizkit.viz.fit import (
        MODEBAR_BAND_PX,
        MODEBAR_PX,
        SUBTITLE_CHARACTER_PX,
        TITLE_CHARACTER_PX,
        TITLE_LINE_PX,
        fit_title,
    )

    title = (
        "Heads of image 1: blocks.2 head 1 adds 0.233 directly; patching it restores 4.17 of "
        "the clean logit<br><sup>click a head in either grid to see its attention, or pick a "
        "layer with the slider above</sup>"
    )
    for width, room in ((450, 430), (950, 930 - MODEBAR_PX)):  # under / left of the mode bar
        fig = go.Figure().update_layout(title=title, margin={"t": 95}, height=470)
        fit_title(fig, width)
        lines = fig.layout.title.text.split("<br>")
        plain = [line.removeprefix("<sup>").removesuffix("</sup>") for line in lines]
        words = title.replace("<br>", " ").replace("<sup>", "").replace("</sup>", "")
        assert " ".join(plain) == words
        sub = [p for p, line in zip(plain, lines, strict=True) if line.startswith("<sup>")]
        main = plain[: len(plain) - len(sub)]
        assert all(len(p) * TITLE_CHARACTER_PX <= room for p in main), width
        assert all(len(p) * SUBTITLE_CHARACTER_PX <= room for p in sub), width
        added = TITLE_LINE_PX * (len(lines) - 2) + MODEBAR_BAND_PX * (width < 700)
        assert (fig.layout.margin.t, fig.layout.height) == (95 + added, 470 + added), width
        assert fig.layout.title.yanchor == "top"
    assert len(main) == 2  # at 950 px, against 3 at 450
    short = fit_title(go.Figure().update_layout(title="CKA explorer: seed 0"), 950)
    assert short.layout.title.text == "CKA explorer: seed 0" and short.layout.margin.t is None


def test_fit_annotations_shrinks_a_crowded_row_and_wraps_a_caption():
    from plotly.subplots import make_subplots

    from vizkit.viz.fit import CHARACTER_PER_FONT_PX, fit_annotations
    from vizkit.viz.style import MIN_FONT_SIZE

    titles = [f"image {i + 31}: 3.51" for i in range(4)]  # the feature browser's
    fig = make_subplots(rows=1, cols=4, subplot_titles=titles)
    caption = " ".join(["del = deletion_auc, ins = insertion_auc, point = pointing_game"] * 3)
    fig.add_annotation(text=caption, x=0, y=-0.1, xref="paper", yref="paper", xanchor="left",
                       showarrow=False)  # fmt: skip
    fig.update_layout(margin={"l": 40, "r": 20, "b": 40}, height=400,
                      sliders=[{"steps": [{"label": "a"}], "pad": {"t": 30}}])  # fmt: skip
    fit_annotations(fig, 450)
    *heads, note = fig.layout.annotations
    slot = (450 - 60) * (heads[1].x - heads[0].x)
    for head in heads:  # shrunk to the legible floor, then wrapped
        lines = head.text.split("<br>")
        assert all(len(line) * head.font.size * CHARACTER_PER_FONT_PX <= slot for line in lines)
    assert all(h.font.size == MIN_FONT_SIZE for h in heads)
    assert " ".join(heads[0].text.split("<br>")) == titles[0] and "<br>" in heads[0].text
    lines = note.text.split("<br>")
    assert " ".join(lines) == caption and len(lines) > 2
    assert all(len(line) * 12 * CHARACTER_PER_FONT_PX <= 390 for line in lines)
    assert note.yanchor == "top" and fig.layout.margin.b > 40 and fig.layout.height > 400
    assert fig.layout.sliders[0].pad.t == 30 + fig.layout.margin.b - 40  # moved down as much
    wide = make_subplots(rows=1, cols=4, subplot_titles=titles)
    fit_annotations(wide, 1400)
    assert [h.font.size for h in wide.layout.annotations] == [16] * 4  # room enough: unchanged


def test_evaluation_bars_rank_no_curve_where_every_prediction_is_near_chance():
    """A random-init model's table: the curves' panels say they are not ranked, the masks'
    panel names its best method, and the title says why."""
    table = vk.metrics.SaliencyTable(
        ["gradcam", "random"], ["deletion_auc", "pointing_game"],
        torch.tensor([[[0.1, 0.2], [1.0, 1.0]], [[0.3, 0.2], [0.0, 1.0]]]), [1.0, 1.0],
        near_chance=torch.ones(2, dtype=torch.bool), target_probability=torch.full((2,), 1e-3),
        prediction_entropy=torch.ones(2),
    )  # fmt: skip
    titles = [a.text for a in vk.viz.evaluation_bars(table).layout.annotations]
    assert "not ranked: near chance" in titles[0] and "best: gradcam" in titles[1]
    assert "near chance on every image" in vk.viz.evaluation_bars(table).layout.title.text
