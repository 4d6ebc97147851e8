"""Explorers: controls redraw the figure, analyses run once per image, inputs are checked."""

from __future__ import annotations

import ipywidgets
import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import timm
import torch
from plotly.callbacks import Points

import vizkit as vk
from vizkit.datasets import Shapes
from vizkit.train import TRACKERS, TrainConfig, train
from vizkit.viz.renderer import EXPORTABLE_RENDERER
from vizkit.widgets import (
    AttentionExplorer,
    CKAExplorer,
    HistoryExplorer,
    SaliencyComparer,
    tracked_quantities,
)
from vizkit.widgets import explorer as explorer_module
from vizkit.widgets.redraw import explicit_ranges


@pytest.fixture(scope="module")
def shapes_vit():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images, labels, masks = vk.datasets.load_sample()
    return model, images[:4], masks[:4]


def heat(explorer):
    return explorer.figure.data[1].z.copy()


def test_attention_explorer_controls_and_cache(shapes_vit):
    model, images, _ = shapes_vit
    explorer = AttentionExplorer(model, images)
    assert explorer.query == "cls" and explorer.computed == 1
    first = heat(explorer)
    explorer.layer.value = 0
    assert (heat(explorer) != first).any()
    expected = vk.attention(model, images[:1]).row("cls", heads="mean")[0, 0]
    assert explorer.figure.data[1].z.max() == pytest.approx(expected.max().item(), rel=1e-5)
    explorer.head.value = 2
    assert "head 2" in explorer.figure.layout.title.text
    explorer.view.value = "rollout"
    explorer.view.value = "class attention"
    explorer.view.value = "query row"
    explorer.image.value = 1
    explorer.image.value = 0  # cached: no new attention
    # one layer's attention at a time: image 0 at the last layer and layer 0, image 1 at layer 0,
    # rollout and class attention of image 0
    assert explorer.computed == 5
    explorer._clicked(explorer.figure.data[1], Points(point_inds=[0], xs=[30], ys=[5]), None)
    assert explorer.query == (1, 7)  # 32 px, 8x8 grid: y 5 -> row 1, x 30 -> column 7
    assert "patch (row 1, col 7)" in explorer.figure.layout.title.text
    heatmap = explorer.static().data[1]
    assert heatmap.z.shape == (8, 8)  # one cell per patch, spanning its 4x4 pixels
    assert (heatmap.x0, heatmap.dx, heatmap.y0, heatmap.dy) == (1.5, 4, 1.5, 4)
    assert heatmap.customdata[1, 7].tolist() == [1, 7]  # hover names the patch, not the pixel
    assert "patch (row %{customdata[0]}, col %{customdata[1]})" in heatmap.hovertemplate
    (outline,) = explorer.figure.layout.shapes  # the query patch, in pixels
    assert (outline.x0, outline.x1, outline.y0, outline.y1) == (27.5, 31.5, 3.5, 7.5)


def test_attention_explorer_disables_controls_that_do_not_apply(shapes_vit):
    model, images, _ = shapes_vit
    explorer = AttentionExplorer(model, images[:2])
    assert not explorer.layer.disabled and not explorer.head.disabled
    for view in ("rollout", "class attention"):
        explorer.view.value = view
        assert explorer.layer.disabled and explorer.head.disabled and not explorer.image.disabled
        assert "do not apply" in explorer.figure.layout.title.text
        assert not explorer.figure.layout.shapes  # no query in these views
    explorer.view.value = "query row"
    assert not explorer.layer.disabled and not explorer.head.disabled


def test_explorer_state_is_what_a_reloaded_page_draws(shapes_vit):
    """A view opened later (a browser reload while the kernel runs) draws the widget's synced
    state; it must be the current figure, not the empty one the widget was created with."""
    model, images, _ = shapes_vit
    explorer = AttentionExplorer(model, images[:2])
    explorer.layer.value = 1
    state = explorer.figure.get_state()
    assert len(state["_widget_data"]) == len(explorer.figure.data) == 2
    assert np.array_equal(state["_widget_data"][1]["z"], explorer.figure.data[1].z)
    assert "layer 1" in state["_widget_layout"]["title"]["text"]


def test_a_redraw_sends_the_whole_figure_and_draws_it_afresh(shapes_vit, monkeypatch):
    """Issues 32 and 68: deltas patched over the previous view left its outline, colour range
    and subplot domains in the browser. A redraw sends no delta: one state message holding the
    kernel's whole figure, then the plot is mounted again (a new view draws that state)."""
    model, images, _ = shapes_vit
    explorer = AttentionExplorer(model, images[:2])
    figure, box = explorer.figure, explorer._plot.box
    sent, mounts = [], []
    monkeypatch.setattr(figure, "_send", lambda msg, buffers=None: sent.append(msg["state"]))
    box.observe(lambda change: mounts.append(change["new"]), names="children")
    explorer.select((2, 3))
    for choice in ("class attention", "rollout", "query row", "rollout"):
        sent.clear(), mounts.clear()
        explorer.view.value = choice
        (state,) = sent
        deltas = {k: v for k, v in state.items() if k.startswith("_py2js") and v is not None}
        assert deltas == {}, choice
        assert state["_widget_layout"] == figure._layout_obj._props, choice
        assert [t["type"] for t in state["_widget_data"]] == [t.type for t in figure.data]
        probe = explorer._plot.page_width
        assert mounts == [(probe,), (probe, figure)], choice
    heat = figure.data[1]
    assert heat.zauto is True and heat.zmin is None and not figure.layout.shapes  # automatic


def test_each_figure_is_drawn_at_the_width_the_page_measured(shapes_vit):
    """Issue 68: plotly's view draws before it is in the page, at 700 px whatever the output
    area. The width a view of `PageWidth` reports (as the page's comm message sets it) redraws
    the current figure at that width, title wrapped to it, and every later figure too."""
    from vizkit.viz.fit import MODEBAR_PX, TITLE_CHARACTER_PX
    from vizkit.widgets.redraw import MIN_WIDTH

    model, images, _ = shapes_vit
    explorer = AttentionExplorer(model, images[:2])
    assert explorer.figure.layout.width in (None, 700)  # no page has measured it
    titles = {}
    for width in (953, 453, 200):
        explorer._plot.page_width.width = width
        assert explorer.figure.layout.width == max(width, MIN_WIDTH)
        titles[width] = explorer.figure.layout.title.text.split("<br>")
        main = [t for t in titles[width] if not t.startswith("<sup>")]
        room = max(width, MIN_WIDTH) - 20 - MODEBAR_PX * (width >= 700)
        assert all(len(line) * TITLE_CHARACTER_PX <= room for line in main)
    assert len(titles[953]) < len(titles[200])  # fewer lines where there is room
    assert explorer.figure.data[1]._click_callbacks  # the redrawn map still answers clicks
    explorer.view.value = "rollout"
    assert explorer.figure.layout.width == MIN_WIDTH and "rollout" in titles_of(explorer)


def titles_of(explorer) -> str:
    return explorer.figure.layout.title.text.replace("<br>", " ")


def test_colour_ranges_are_explicit():
    """plotly.js keeps a range it computed: every colour range says auto or gives both limits
    (the missing one from the data, as plotly.js would)."""
    figure = go.Figure([
        go.Heatmap(z=[[1, 2], [3, np.nan]], zmax=5), go.Heatmap(z=[[4, 6]]),
        go.Heatmap(z=[[1, 2]], coloraxis="coloraxis"), go.Image(z=[[[0, 0, 0]]]),
    ]).update_layout(coloraxis={"cmin": 0})  # fmt: skip
    explicit_ranges(figure)
    fixed, auto, shared = figure.data[:3]
    assert (fixed.zauto, fixed.zmin, fixed.zmax) == (False, 1.0, 5)
    assert (auto.zauto, auto.zmin, auto.zmax) == (True, None, None)
    assert shared.zauto is None  # its colour axis holds the range
    axis = figure.layout.coloraxis
    assert (axis.cauto, axis.cmin, axis.cmax) == (False, 0, 2.0)


def test_explorer_shows_its_widget_then_a_static_copy_that_follows_it(shapes_vit, monkeypatch):
    """Displayed: the widget (no HTML of its own, or an export without widget state would draw
    the view twice), then the view as HTML that hides itself beside a drawn widget and that each
    refresh updates (an export shows the view the explorer ended on)."""
    model, images, _ = shapes_vit
    shown = []
    monkeypatch.setattr(explorer_module, "display", lambda b, **kw: shown.append((b, kw)))
    monkeypatch.setattr(pio.renderers, "default", EXPORTABLE_RENDERER)
    explorer = AttentionExplorer(model, images[:2])
    explorer._ipython_display_()
    (widget, _), (static, where) = shown
    assert set(widget) == {"application/vnd.jupyter.widget-view+json", "text/plain"}
    key = explorer._key
    html = static["text/html"]
    assert f"body:has(.vizkit-explorer-{key} .js-plotly-plot) .vizkit-static-{key}" in html
    assert f'class="vizkit-static vizkit-static-{key}"' in html
    assert "Plotly.newPlot" in html and "Attention of" in html
    assert "click a patch" not in html  # the static copy cannot be clicked
    explorer.view.value = "rollout"
    update, how = shown[-1]
    assert how == {**where, "update": True} and where["display_id"] == key
    assert "rollout of image 0" in update["text/html"]
    assert "click a patch" not in update["text/html"]


def test_static_view_drops_the_subtitles_about_controls(shapes_vit):
    model, images, _ = shapes_vit
    explorer = AttentionExplorer(model, images[:2])
    assert explorer.figure.layout.title.text.endswith("click a patch to make it the query</sup>")
    title = explorer.static().layout.title.text
    assert title.startswith("Attention of") and "<sup>" not in title
    explorer.view.value = "rollout"
    assert "layer and head do not apply" in explorer.figure.layout.title.text
    assert explorer.static().layout.title.text == "rollout of image 0"
    assert "<sup>" in explorer.figure.layout.title.text  # the widget keeps them


def test_query_row_colour_bar_starts_at_zero(shapes_vit):
    model, images, _ = shapes_vit
    explorer = AttentionExplorer(model, images[:2])
    heatmap = explorer.figure.data[1]
    assert (heatmap.zmin, heatmap.zmax) == (0, pytest.approx(float(heatmap.z.max())))


def test_explorer_controls_sit_on_a_full_width_grid(shapes_vit):
    model, images, _ = shapes_vit
    explorer = AttentionExplorer(model, images[:2])
    grid, progress, plot = explorer.widget.children
    assert isinstance(grid, ipywidgets.GridBox)
    assert plot.children == (explorer._plot.page_width, explorer.figure)
    assert progress is explorer.progress_output  # long work's progress bars, inside the explorer
    assert "repeat(2" in grid.layout.grid_template_columns
    assert all(control.layout.width == "auto" for control in grid.children)  # fill the cell
    view = next(c for c in grid.children if isinstance(c, ipywidgets.ToggleButtons))
    assert view.layout.grid_area.endswith("/ -1")  # the view buttons have a row of their own


def test_attention_explorer_on_cait_starts_on_a_patch(cait):
    model, x = cait
    explorer = AttentionExplorer(model, x)
    assert explorer.query == (2, 2)  # CaiT's self-attention stage has no class token
    explorer.view.value = "class attention"
    assert "class attention" in explorer.figure.layout.title.text


def test_explorers_check_their_inputs(shapes_vit):
    model, images, masks = shapes_vit
    with pytest.raises(ValueError, match="empty"):
        AttentionExplorer(model, images[:0])
    with pytest.raises(ValueError, match="built for 32x32"):
        AttentionExplorer(model, torch.randn(2, 3, 40, 40))
    with pytest.raises(ValueError, match="no self-attention"):
        AttentionExplorer(timm.create_model("resnet10t", num_classes=3).eval(), images)
    with pytest.raises(ValueError, match="masks must be"):
        SaliencyComparer(model, images, masks=masks[:2])
    with pytest.raises(ValueError, match="empty"):
        CKAExplorer({})
    with pytest.raises(ValueError, match="empty"):
        HistoryExplorer([])


def test_saliency_comparer_shows_each_images_scores(shapes_vit):
    model, images, masks = shapes_vit
    comparer = SaliencyComparer(model, images, masks=masks, methods=["rollout", "random"])
    comparer.image.value = 2
    comparer.image.value = 0
    comparer.image.value = 2
    assert comparer.computed == 2  # images 0 and 2, once each
    titles = [a.text for a in comparer.figure.layout.annotations]
    assert "image 2" in comparer.figure.layout.title.text
    expected = vk.compare_saliency(
        model, images[2:3], ["rollout", "random"], masks=masks[2:3], steps=comparer.steps
    )
    rollout_title = next(t for t in titles if "rollout" in t)
    assert f"point {expected.mean[0, 2]:.2f}" in rollout_title
    assert f"del {expected.mean[0, 0]:.2f}" in rollout_title


def test_cka_explorer_switches_results():
    torch.manual_seed(0)
    images = torch.randn(16, 3, 32, 32)
    evolutions = {}
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8,
                                  embed_dim=32, depth=3, num_heads=2).eval()  # fmt: skip
        evolutions[f"seed {seed}"] = vk.feature_evolution(
            model, images, batch_size=8, progress=False
        )
    explorer = CKAExplorer(evolutions)
    first = explorer.figure.data[0].z.copy()
    explorer.choice.value = "seed 1"
    assert (explorer.figure.data[0].z != first).any()
    widths = {t.name: t.line.width for t in explorer.figure.data[1:]}
    assert widths["seed 1"] > widths["seed 0"]


def test_history_explorer_covers_every_tracked_quantity():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32,
                              depth=2, num_heads=2, num_classes=10, init_values=0.1)  # fmt: skip
    history = train(model, Shapes("train", n=64), Shapes("test", n=16),
                    TrainConfig(epochs=2, batch_size=32, threads=1),
                    [cls() for cls in TRACKERS.values()], progress=False)  # fmt: skip
    quantities = tracked_quantities(history)
    assert {"test_accuracy", "attention_entropy", "cka_to_previous", "residual_ratios.attn",
            "layerscale.mlp.mean_abs"} <= set(quantities)  # fmt: skip
    assert quantities["cka_to_previous"][0] is None
    explorer = HistoryExplorer({"history": history})
    explorer.quantity.value = "residual_ratios.attn"
    assert len(explorer.figure.data) == 2  # one line per epoch
    assert explorer.figure.data[1].line.color == "black"  # the chosen (last) epoch
    explorer.epoch.value = 1
    assert explorer.figure.data[0].line.color == "black"
    first_epoch = vk.ResidualRatios.from_dict(history[0]["residual_ratios"])
    assert list(explorer.figure.data[0].y) == pytest.approx(first_epoch.attn.tolist())
    explorer.quantity.value = "cka_to_previous"
    assert "not recorded at epoch 1" in explorer.figure.layout.title.text.replace("<br>", " ")
    explorer.quantity.value = "test_accuracy"
    assert list(explorer.figure.data[0].y) == [h["test_accuracy"] for h in history]


def test_layerscale_explorer_shows_eps_times_the_unscaled_ratio():
    from vizkit.papers.cait import LayerScaleExplorer

    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    explorer = LayerScaleExplorer(images, depth=3)
    explorer.eps.value = 1e-3
    plain, scaled, product = explorer.figure.data
    assert list(scaled.y) == pytest.approx(list(product.y), rel=1e-6)
    assert all(s < p for s, p in zip(scaled.y, plain.y, strict=True))
    explorer.eps.value = 1.0
    assert list(explorer.figure.data[1].y) == pytest.approx(list(explorer.figure.data[0].y))
    assert explorer.computed == 3  # ε = 0.1 (initial), 1e-3, 1.0


def test_refiner_explorer_moves_over_blocks_and_images():
    import timm

    from vizkit.papers.refiner import RefinerExplorer

    torch.manual_seed(0)
    model = timm.create_model("vizkit_refined_vit_tiny_official", depth=4, embed_dim=32).eval()
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    explorer = RefinerExplorer(model, images)
    assert explorer.block.options == (1, 3)  # sharing blocks refine; computing blocks do not
    explorer.image.value = 2
    stages = explorer.stages(1)
    assert explorer.figure.data[-1].z.tolist() == stages.maps["refined"][2, 3].tolist()
    explorer.block.value = 3
    assert explorer.computed == 2
    with pytest.raises(ValueError, match="no attention refiner"):
        RefinerExplorer(timm.create_model("vit_tiny_patch16_224", img_size=32, depth=1), images)


def test_saliency_comparer_switches_between_methods(shapes_vit):
    """The method menu shows one method's map, or all side by side (wrapping after six); a
    method the model refuses falls back to all, saying why beside the slider."""
    model, images, masks = shapes_vit
    comparer = SaliencyComparer(model, images, masks=masks)
    assert comparer.methods == vk.methods.default_methods(True)
    assert list(comparer.method.options) == ["all", *comparer.methods]
    panels = len([t for t in comparer.figure.data if t.type == "heatmap"])
    assert panels == len(comparer.methods)
    comparer.method.value = "attnlrp"
    assert comparer.computed == 1  # switching redraws, it does not score again
    assert [t.type for t in comparer.figure.data].count("heatmap") == 1
    assert comparer.figure.layout.title.text.startswith("attnlrp on image 0")
    every = SaliencyComparer(model, images[:1], methods="all", steps=2, progress=False)
    assert len(every.methods) == len(vk.methods.METHODS)
    rows = {a.y for a in every.figure.layout.annotations if "<b>" in (a.text or "")}
    assert len(rows) >= 3  # 19 methods, six to a row


def test_saliency_comparer_shows_a_methods_sanity_check(shapes_vit):
    """The view buttons switch to the chosen method's maps as the model's layers are
    randomized from the top (computed once per image and method); a method the model refuses
    stays on the maps, saying why."""
    model, images, masks = shapes_vit
    comparer = SaliencyComparer(model, images, masks=masks, methods=["gradcam", "random"],
                                progress=False)  # fmt: skip
    comparer.method.value = "gradcam"
    comparer.view.value = "sanity check"
    titles = [a.text for a in comparer.figure.layout.annotations if a.text]
    expected = vk.sanity_check(model, images[:1], "gradcam", progress=False)
    assert titles[0] == "trained" and titles[1].startswith("up to head")
    assert len([t for t in comparer.figure.data if t.type == "heatmap"]) == len(expected.layers) + 1
    computed = comparer.computed
    comparer.view.value = "maps"
    comparer.view.value = "sanity check"
    assert comparer.computed == computed
    cait, _ = vk.zoo.load("cait_tiny_shapes")
    other = SaliencyComparer(cait, images, methods=["rollout", "random"], progress=False)
    other.view.value = "sanity check"
    assert "no sanity check of rollout" in other.status.value


def test_saliency_comparer_shows_road_curves_and_the_evaluation_over_all_images(shapes_vit):
    """The view "ROAD curves": each method's MoRF and LeRF curves on the image, equal to
    `vk.metrics.road` on the maps shown; "all images": `vk.evaluate`'s bars over every image,
    computed once."""
    model, images, masks = shapes_vit
    comparer = SaliencyComparer(model, images[:3], masks=masks[:3], methods=["gradcam", "random"],
                                progress=False)  # fmt: skip
    comparer.view.value = "ROAD curves"
    lines = [t for t in comparer.figure.data if t.mode == "lines+markers"]
    assert len(lines) == 4 and lines[0].name.startswith("gradcam (areas ")
    gradcam = comparer.table(0).results["gradcam"]
    morf = vk.metrics.road(model, images[:1], gradcam)
    assert list(lines[0].y) == pytest.approx(morf.scores[0].tolist())
    comparer.method.value = "random"
    assert [t.name for t in comparer.figure.data if t.showlegend][0].startswith("random")
    comparer.view.value = "all images"
    titles = [a.text for a in comparer.figure.layout.annotations]
    assert any(t.startswith("pointing_game") for t in titles)  # the masks were passed on
    assert "over 3 images" in comparer.figure.layout.title.text
    computed = comparer.computed
    comparer.image.value = 2
    assert comparer.computed == computed  # the evaluation does not depend on the image


def test_mechanistic_explorer_clicks_a_head_and_reads_the_lens(shapes_vit):
    """A click on a head of either grid selects it (the third panel shows its attention); the
    grids are the image's direct logit attribution and head patching; the lens view shows the
    chosen layer; each analysis runs once per image."""
    from vizkit.widgets import MechanisticExplorer

    model, images, masks = shapes_vit
    corrupted = images[:2] * (~masks[:2, None]).float()
    explorer = MechanisticExplorer(model, images[:2], corrupted=corrupted)
    dla = vk.direct_logit_attribution(model, images[:1])
    grid = explorer.figure.data[0]
    assert list(grid.y) == dla.blocks
    torch.testing.assert_close(torch.tensor(grid.z, dtype=torch.float32), dla.heads[0])
    patched = vk.activation_patching(model, images[:1], corrupted[:1], sites=("heads",),
                                     progress=False)  # fmt: skip
    torch.testing.assert_close(torch.tensor(explorer.figure.data[1].z, dtype=torch.float32),
                               patched.heads[0])  # fmt: skip

    class Points:
        xs, ys = ["head 2"], [dla.blocks[1]]

    explorer.figure.data[1]._click_callbacks[0](explorer.figure.data[1], Points(), None)
    assert (explorer.layer.value, explorer.head.value) == (1, 2)
    assert explorer.figure.layout.annotations[2].text == f"{dla.blocks[1]} head 2"
    computed = explorer.computed
    explorer.view.value = "logit lens"
    assert explorer.head.disabled
    assert "after blocks.1" in explorer.figure.layout.annotations[1].text
    explorer.view.value = "heads"
    explorer.layer.value = 0
    assert explorer.computed == computed + 2  # the lens, then block 0's attention
    explorer.layer.value = 3
    assert explorer.computed == computed + 2  # block 3's was drawn first
    with pytest.raises(ValueError, match="no transformer blocks"):
        MechanisticExplorer(vk.create_model("resnet18", num_classes=3), images[:1])
