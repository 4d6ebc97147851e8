"""CircuitExplorer in the kernel: what it draws is the attribution result's circuit, its
faithfulness and its nodes' per-patch effects, after every control (the page is compared with
the kernel in tests/test_explorers_in_lab.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import vizkit as vk
from vizkit.circuits import circuit
from vizkit.concepts import Heads, dissect, shapes_concepts, unit_names
from vizkit.widgets.circuit_explorer import CLICK_HINT


@pytest.fixture(scope="module")
def explorer():
    model, card = vk.zoo.load("vit_tiny_shapes")
    clean, ring, labels, _ = vk.datasets.counterfactual_shapes(40, replace=3)
    circles = labels == 0
    return vk.widgets.CircuitExplorer(model, clean[circles][:4], ring[circles][:4], target=0,
                                      versus=3, classes=card["classes"])  # fmt: skip


def _edges_drawn(figure) -> set[str]:
    lines = [t for t in figure.data if t.type == "scatter" and t.mode == "lines"
             and t.xaxis in (None, "x")]  # fmt: skip
    return {text.split(":")[0] for t in lines for text in t.text if text}


def _circuit_names(result, size: int) -> set[str]:
    kept = circuit(result, size).edges
    return {f"{result.upstream[u]} → {result.downstream[d]}" for u, d in kept.nonzero().tolist()}


def test_the_graph_and_the_marker_follow_the_size(explorer):
    result, curve = explorer.result, explorer.curve
    at = curve.sizes.tolist().index(explorer.size.value)
    assert explorer.size.value > 0 and float(curve.faithfulness[at]) >= 0.8  # the first shown
    for size in (explorer.size.options[1], explorer.size.options[-1]):
        explorer.size.value = size
        assert _edges_drawn(explorer.figure) == _circuit_names(result, size)
        marker = next(t for t in explorer.figure.data if t.type == "scatter"
                      and t.xaxis == "x2" and len(t.x) == 1)  # fmt: skip
        at = curve.sizes.tolist().index(size)
        assert marker.y[0] == pytest.approx(float(curve.faithfulness[at]))
        assert f"{size} edges recover {float(curve.faithfulness[at]):.2f}" in (
            explorer.figure.layout.title.text.replace("<br>", " "))  # fmt: skip
    assert "circle vs ring" in explorer.figure.layout.title.text


def test_a_click_chooses_a_node_and_the_map_is_its_effect_at_each_patch(explorer):
    nodes = explorer.figure.data[explorer._nodes_trace]
    assert nodes.name == "nodes" and len(nodes.x) == len(explorer.result.upstream)
    assert explorer.node.value != 0  # the embedding (the whole corruption) is not the default
    explorer._clicked(nodes, SimpleNamespace(point_inds=[2]), None)
    explorer.image.value = 1
    assert explorer.node.value == 2
    assert explorer.figure.data[explorer._nodes_trace].marker.line.width[2] == 3
    heat = next(t for t in explorer.figure.data if t.type == "heatmap")
    result = explorer.result
    _, patches = result.layout.split(result.tokens[1:2, 2], dim=1)
    torch.testing.assert_close(torch.tensor(heat.z, dtype=torch.float32),
                               result.layout.to_grid(patches)[0].float())  # fmt: skip
    assert heat.zmin == -heat.zmax  # centred on no effect
    assert f"changes image 1's score by {float(result.nodes[1, 2]):+.3g}" in (
        explorer.figure.layout.title.text.replace("<br>", " "))  # fmt: skip
    assert CLICK_HINT not in explorer.static().layout.title.text


def test_a_score_target_is_named_by_its_label():
    torch.manual_seed(0)
    model = vk.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                            num_classes=5, embed_dim=48, num_heads=3).eval()  # fmt: skip
    x, y = torch.randn(2, 2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    shown = vk.widgets.CircuitExplorer(model, x, y, target=vk.targets.embedding_norm(),
                                       progress=False)  # fmt: skip
    assert shown.figure.layout.title.text.startswith("Circuit of the embedding norm:")
    assert shown.result.targets is None


def test_heads_named_by_dissection_show_their_names(explorer):
    """A dissection of the last block's heads names them in the node list and the titles;
    names of units other than heads, and of a circuit without head nodes, are refused."""
    model, _ = vk.zoo.load("vit_tiny_shapes")
    shapes, concepts = shapes_concepts(24)
    named = dissect(model, shapes, concepts, Heads("blocks.3"), quantile=0.02, progress=False)
    labels = {f"blocks.3 head {h}": name for h, name in unit_names(named).items()}
    assert labels  # some head is a detector
    clean, ring, classes, _ = vk.datasets.counterfactual_shapes(40, replace=3)
    x, corrupted = clean[classes == 0][:2], ring[classes == 0][:2]
    shown = vk.widgets.CircuitExplorer(model, x, corrupted, target=0, versus=3, names=named,
                                       sizes=[1, 4], progress=False)  # fmt: skip
    options = {u: label for label, u in shown.node.options}
    for u, node in enumerate(shown.result.upstream):
        name = labels.get(node)
        assert options[u] == (node if name is None else f"{node} ({name.split(' (')[0]})")
    node = next(iter(labels))
    shown.node.value = shown.result.upstream.index(node)
    assert f"{node} ({labels[node].split(' (')[0]})" in shown.figure.layout.title.text
    channels = dissect(model, shapes, concepts, "blocks.3.hook_resid_post", progress=False)
    with pytest.raises(ValueError, match="not of heads"):
        vk.widgets.CircuitExplorer(model, x, corrupted, target=0, versus=3, names=channels,
                                   sizes=[1], progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="heads=True"):
        vk.widgets.CircuitExplorer(model, x, corrupted, target=0, versus=3, names=named,
                                   heads=False, sizes=[1], progress=False)  # fmt: skip
