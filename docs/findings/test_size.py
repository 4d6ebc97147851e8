"""Would a larger test set decide the claims ledgers' Shapes rows? Each Shapes configuration the
ledgers compare over seeds, its models evaluated on the cards' test set (2,000 images) and on
20,000 more from the same generated test split, recorded in docs/findings/test_size.json;
`docs/ledger.py` states the ratio of the seed spreads under the inconclusive rows.

    python docs/findings/test_size.py      # about 30 minutes on 2 cores

If the seed spread came from the test set (each model's accuracy on 2,000 images is its
accuracy on the distribution plus binomial noise), ten times the images would shrink it by up
to sqrt(10); if it comes from training (the models differ), it stays.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

import vizkit as vk
from vizkit.datasets import Shapes
from vizkit.train.trainer import loss_and_accuracy

FINDINGS = Path(__file__).resolve().parent
RECORD = FINDINGS / "test_size.json"
TEST_IMAGES = 20_000
COMMAND = "python docs/findings/test_size.py"


def _load(name: str, file: Path):
    spec = importlib.util.spec_from_file_location(name, file)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def configurations() -> dict[str, tuple[int, ...]]:
    """{card prefix: seeds} of the Shapes configurations of several seeds that a ledger row
    compares, at any of its budgets (all of them by their final test accuracy; one row of
    Refiner's compares two of them after epoch 1 too)."""
    ledger = _load("ledger_for_test_size", FINDINGS.parent / "ledger.py")
    found: dict[str, set[int]] = {}
    for claims in ledger.CLAIMS.values():
        for claim in claims:
            for budget in claim.budgets:
                for group in getattr(claim.measured(budget), "groups", ()):  # contrasts
                    name = f"{group.source}_s{group.seeds[0]}"
                    if len(group.seeds) > 1 and vk.zoo.card(name)["data"]["name"] == "shapes":
                        found.setdefault(group.source, set()).update(group.seeds)
    return {prefix: tuple(sorted(seeds)) for prefix, seeds in sorted(found.items())}


def measure(test_images: int = TEST_IMAGES) -> dict:
    """Accuracy of every model of `configurations` on the cards' test set (read from the
    cards) and on ``test_images`` images of the test split; the sha256 of each model."""
    larger = Shapes("test", n=test_images)
    found, models, card_test_images = {}, {}, set()
    runs = [(prefix, seed) for prefix, seeds in configurations().items() for seed in seeds]
    for prefix, seed in tqdm(runs, desc="models"):
        model, card = vk.zoo.load(f"{prefix}_s{seed}")
        entry = found.setdefault(prefix, {"seeds": [], "cards": [], "larger": []})
        entry["seeds"].append(seed)
        entry["cards"].append(card["test_accuracy"])
        entry["larger"].append(loss_and_accuracy(model, larger)["accuracy"])
        models[card["name"]] = card["sha256"]
        card_test_images.add(card["data"]["test"])
    (card_test_images,) = card_test_images  # one test set for every card compared
    return {"card_test_images": card_test_images, "test_images": test_images,
            "configurations": found, "models": models}  # fmt: skip


def main() -> None:
    stamp = _load("findings_record", FINDINGS / "record.py").stamp
    content = {**measure(), "stamp": stamp(COMMAND)}
    RECORD.write_text(json.dumps(content, indent=1) + "\n")
    print(f"recorded {RECORD.relative_to(FINDINGS.parents[1])}", file=sys.stderr)


if __name__ == "__main__":
    main()
