"""Explorer response times on the zoo models: seconds per control change (the first visit of an
image computes its analyses; later ones only redraw), median and max over the steps.

Usage: python benchmarks/widgets.py [--device cuda] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from timing import add_device_options, device_name, precision, record

import vizkit as vk
from vizkit.widgets import AttentionExplorer, CKAExplorer, HistoryExplorer, SaliencyComparer


def timed(explorer, control, values) -> list[float]:
    """Set ``control`` to each value; wall seconds of each change (compute + redraw)."""
    out = []
    for value in values:
        start = time.perf_counter()
        control.value = value
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = add_device_options(parser).parse_args()
    torch.set_num_threads(2)
    with precision(args):
        rows = measure(args.device)
    title = (
        f"explorer response, {args.dtype}, {device_name(args.device)}, torch {torch.__version__}"
    )
    print(title + "; seconds")
    print(f"{'model':<18} {'change':<42} {'median':>7} {'max':>7}")
    table = []
    for model, change, seconds in rows:
        print(f"{model:<18} {change:<42} {statistics.median(seconds):7.3f} {max(seconds):7.3f}")
        table.append([model, change, f"{statistics.median(seconds):.3f}", f"{max(seconds):.3f}"])
    if args.record:
        columns = ["model", "change", "median s", "max s"]
        print(f"recorded in {record(args, title, columns, table)}")


def measure(device: str) -> list[tuple[str, str, list[float]]]:
    """(model, change, seconds of each change) for every explorer and control."""
    images, _, masks = vk.datasets.load_sample()
    images, masks = images[:8], masks[:8]
    rows = []
    for name in ("vit_tiny_shapes", "cait_tiny_shapes"):
        model, card = vk.zoo.load(name)
        model = model.to(device)
        explorer = AttentionExplorer(model, images)
        first_visit = timed(explorer, explorer.image, range(1, 8))
        layers = timed(explorer, explorer.layer, [0, 1, 2, 0, 1, 2])
        views = timed(explorer, explorer.view, ["rollout", "class attention", "query row"] * 2)
        revisit = timed(explorer, explorer.image, range(0, 8))
        rows += [
            (name, "AttentionExplorer: new image", first_visit),
            (name, "AttentionExplorer: layer slider", layers),
            (name, "AttentionExplorer: view (first + cached)", views),
            (name, "AttentionExplorer: cached image", revisit),
        ]
        comparer = SaliencyComparer(model, images, masks)
        rows += [
            (name, "SaliencyComparer: new image", timed(comparer, comparer.image, range(1, 8))),
            (name, "SaliencyComparer: cached image", timed(comparer, comparer.image, range(0, 8))),
        ]
        history = HistoryExplorer(card)
        rows.append((name, "HistoryExplorer: epoch", timed(history, history.epoch, [1, 2, 3, 4])))
        evolution = vk.feature_evolution(model, vk.datasets.load_sample()[0], progress=False)
        cka = CKAExplorer({name: evolution, "again": evolution})
        rows.append((name, "CKAExplorer: result", timed(cka, cka.choice, ["again", name] * 2)))
    rows += _feature_browser(device)
    return rows


def _feature_browser(device: str) -> list[tuple[str, str, list[float]]]:
    """FeatureBrowser on an autoencoder of the shipped ViT's second-to-last block (the
    Shapes sample, all tokens; expansion 4, k=8)."""
    import tempfile

    model, _ = vk.zoo.load("vit_tiny_shapes")
    model = model.to(device)
    images = vk.datasets.load_sample()[0].to(device)
    with tempfile.TemporaryDirectory() as folder:
        store = vk.cache_activations(model, images, f"{folder}/s", layers=[-2], tokens="all",
                                     progress=False)  # fmt: skip
        sae = vk.train_sae(store, expansion=4, k=8, tokens=10 * len(store), batch_size=256,
                           device=device, progress=False)  # fmt: skip
        browser = vk.widgets.FeatureBrowser(model, sae, images)
        latents = [value for _, value in browser.latent.options[1:9]]
        name = "vit_tiny_shapes"
        rows = [(name, "FeatureBrowser: new latent (ablate)", timed(browser, browser.latent,
                                                                      latents))]  # fmt: skip
        browser.action.value = "steer"
        rows.append((name, "FeatureBrowser: steer strength",
                     timed(browser, browser.strength, [0.5, 1.5, 2.0, -1.0])))  # fmt: skip
        orders = timed(browser, browser.order, ["logit effect", "density"] * 2)
        rows.append((name, "FeatureBrowser: order", orders))
    return rows


if __name__ == "__main__":
    main()
