"""The training sweeps that would decide the claims ledgers' inconclusive rows: more seeds or a
larger budget of recipes the zoo already has, written as recipes for `vizkit train`.

    python docs/findings/sweeps.py list                 # each sweep: its runs, the rows it serves
    python docs/findings/sweeps.py write gpu DIR        # its recipes not yet in the zoo, in order
    python docs/findings/sweeps.py pack ZOO OUT         # (on the device) ZOO's models as parts
    python docs/findings/sweeps.py adopt DIR PART...    # (here) the parts' models into the zoo

A recipe is derived from a shipped one (its first seed): the same model, data and recipe, with
another seed and, for a larger budget, more epochs (or blocks) and a name that says so
(``sot_sum_e24_s1``: `docs/ledger.py` reads a budget by that name suffix). The files are
numbered in the sweep's order, most decisive per training minute first, so
``vizkit train DIR/*.json --jobs N --stop-after M`` trains as much of it as fits:

    vizkit train DIR/*.json --device cuda --jobs 8 --stop-after 6   # the "gpu" sweep
    vizkit train DIR/*.json --jobs 2 --stop-after 110                # the "cpu" sweep, 2 cores

On a lent device machine, which returns at most 8 files of 16 MiB (64 MiB in all) from
``$OUT``, the runs go to a zoo of their own and come back packed; here ``adopt`` checks each
model against the sweep's recipe and its checkpoint against its card, and puts both the model and
its recipe beside the shipped ones:

    python docs/findings/sweeps.py write gpu .sweep/gpu                         # here
    VIZKIT_MODELS=/tmp/zoo vizkit train .sweep/gpu/*.json --device cuda --jobs 8 \
        --stop-after 6; python docs/findings/sweeps.py pack /tmp/zoo $OUT        # there
    python docs/findings/sweeps.py adopt .sweep/gpu PARTS...                    # here

A ledger row reads only the budgets and seeds it names: after a sweep, give the rows an
extension serves (``list``) its budget (``budgets``, ``seeds_at`` in docs/ledger.py).
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import vizkit as vk
from vizkit.train.recipes import RECIPES_DIR, load_recipe, write_models_readme

PART_BYTES = 15 * 2**20  # a file back from the device: at most 16 MiB
PACKED_BYTES = 60 * 2**20  # all of them: at most 64 MiB, the log beside them
PARTS = 7  # at most 8 files, the log one of them


@dataclass(frozen=True)
class Extension:
    """Seeds ``seeds`` of shipped recipe ``base`` (its seed-0 recipe), at ``epochs`` (default:
    the base's) with ``kwargs`` changed, named ``<base><suffix>_s<seed>``; ``rows`` names the
    ledger rows it serves. ``threads`` (default: the base's) sets the run's CPU threads: one
    for runs side by side on a small machine."""

    base: str
    suffix: str
    seeds: range
    rows: str
    epochs: int | None = None
    kwargs: tuple[tuple[str, object], ...] = ()
    threads: int | None = None

    def recipes(self) -> list[dict]:
        spec = load_recipe(f"{self.base}_s0")
        out = []
        for seed in self.seeds:
            train = {**spec["train"], "seed": seed}
            if self.epochs is not None:
                train["epochs"] = self.epochs
            if self.threads is not None:
                train["threads"] = self.threads
            name = f"{self.base}{self.suffix}_s{seed}"
            out.append({**spec, "name": name, "kwargs": {**spec["kwargs"], **dict(self.kwargs)},
                        "train": train})  # fmt: skip
        return out

    def minutes(self) -> float:
        """About how long one run takes on the machine its base trained on: the base's card
        time scaled by the epochs and, for a deeper model, the depth."""
        card = vk.zoo.card(f"{self.base}_s0")
        scale = (self.epochs or card["recipe"]["epochs"]) / card["recipe"]["epochs"]
        depth = dict(self.kwargs).get("depth")
        if depth is not None:
            scale *= depth / card["kwargs"]["depth"]
        return card["training_seconds"] * scale / 60


def _seeds(configs: list[str], seeds: range, rows: str, suffix: str = "", **options) -> list:
    return [Extension(c, suffix, seeds, rows, **options) for c in configs]


MORE = range(3, 10)  # seeds 3-9: ten per configuration with the shipped 0-2
THREE = range(3)
DIGITS = ("sum", "pool_gcp", "svpn_a05", "pool_gap", "classt", "svpn_a07")  # nearest first
MASKS = ("gap", "elm", "gmm_k1", "rmt")
SOT = ("sum", "classt", "pool_gap", "pool_gcp", "svpn_a05", "svpn_a10", "svpn_a03", "svpn_a07",
       "wordt")  # fmt: skip
SWEEPS = {  # groups of extensions, trained group by group
    # two runs side by side on 2 cores, one thread each: the rows nearest a decision first
    "cpu": [
        _seeds(["sot_svpn_a03", "sot_svpn_a07"], range(1, 3), "SoT 10, 11", threads=1),
        _seeds([f"sot_digits_{c}_e80" for c in DIGITS[:3]], MORE, "SoT 16, 20", threads=1),
        _seeds(["refiner_r3_k3_e4", "refiner_r3_k5_e4"], range(3, 5), "Refiner 3", threads=1),
        _seeds([f"sot_digits_{c}_e80" for c in DIGITS[3:5]], MORE, "SoT 4, 15, 17", threads=1),
        _seeds(["sot_sum"], THREE, "SoT 3, 5", "_e12", epochs=12, threads=1),
        _seeds(["sot_svpn_a05", "sot_svpn_a03"], range(3, 7), "SoT 10", threads=1),
    ],
    # the cheapest decisions first (Digits runs are seconds on a GPU, minutes on a CPU)
    "gpu": [
        _seeds([f"sot_digits_{c}_e80" for c in DIGITS], MORE, "SoT 4, 15, 16, 19, 20"),
        _seeds([f"masks_{c}" for c in MASKS], THREE, "masks 2, 4, 8", "_e18", epochs=18),
        _seeds([f"sot_{c}" for c in SOT], THREE, "SoT 1, 3, 5, 7, 9-14", "_e24", epochs=24),
        _seeds(["refiner_r1_k3", "refiner_r2_k3"], THREE, "Refiner 4", "_e8", epochs=8),
        [
            Extension("table2_vit_cls0", "_d12", THREE, "CaiT 1, 2", 12, (("depth", 12),)),
            Extension(
                "table2_vit_cls4",
                "_d12",
                THREE,
                "CaiT 1",
                12,
                (("depth", 12), ("cls_insert_layer", 10)),
            ),  # fmt: skip
            Extension("table2_cait_ca2", "_d12", THREE, "CaiT 2", 12, (("depth", 10),)),
        ],
    ],
}


def sweep_recipes(name: str) -> list[dict]:
    """The recipes of sweep ``name`` whose models the zoo does not have yet, in order."""
    if name not in SWEEPS:
        raise KeyError(f"No sweep {name!r}; sweeps: {sorted(SWEEPS)}.")
    have = set(vk.zoo.list_models())
    ordered = []
    for group in SWEEPS[name]:  # seed-major inside a group: a sweep cut short has whole seeds
        runs = [r for e in group for r in e.recipes()]
        ordered += sorted(runs, key=lambda r: r["train"]["seed"])
    return [r for r in ordered if r["name"] not in have]


def write(name: str, folder: Path) -> list[Path]:
    """Write sweep ``name``'s missing recipes into ``folder`` as ``NNN_<recipe>.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, recipe in enumerate(sweep_recipes(name)):
        path = folder / f"{i:03d}_{recipe['name']}.json"
        path.write_text(json.dumps(recipe, indent=1) + "\n")
        load_recipe(path)  # a derived recipe is a valid one
        paths.append(path)
    return paths


def pack(zoo: Path, out: Path) -> list[Path]:
    """The models of ``zoo`` (card and checkpoint) as ``out/models-<i>.tar`` parts of whole
    models, each under PART_BYTES, in the order they were trained (a sweep's most decisive
    first) until PACKED_BYTES; prints the names of the models that did not fit."""
    cards = [c for c in zoo.glob("*.json") if c.with_suffix(".safetensors").is_file()]
    parts: list[list[Path]] = []
    sizes: list[int] = []
    left_out = []
    for card in sorted(cards, key=lambda c: c.stat().st_mtime):
        files = [card, card.with_suffix(".safetensors")]
        size = sum(f.stat().st_size for f in files)
        if sum(sizes) + size > PACKED_BYTES or size > PART_BYTES:
            left_out.append(card.stem)
            continue
        if not parts or sizes[-1] + size > PART_BYTES:
            if len(parts) == PARTS:
                left_out.append(card.stem)
                continue
            parts.append([])
            sizes.append(0)
        parts[-1] += files
        sizes[-1] += size
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i, files in enumerate(parts):
        path = out / f"models-{i}.tar"
        with tarfile.open(path, "w") as tar:
            for file in files:
                tar.add(file, arcname=file.name)
        written.append(path)
    if left_out:
        print(f"left out (over {PACKED_BYTES >> 20} MiB): {', '.join(left_out)}")
    return written


def adopt(sweep: Path, parts: list[Path], zoo: Path | None = None,
          recipes: Path = RECIPES_DIR) -> list[str]:  # fmt: skip
    """Put the models packed in ``parts`` into ``zoo`` (default: where `vizkit train`
    writes) and their recipes from the folder ``sweep`` (``NNN_<name>.json``) into
    ``recipes``; returns their names. Nothing is written unless every model is a run of its
    recipe (name, architecture, kwargs, data, init and training settings on its card), its
    checkpoint has its card's sha256, and neither it nor its recipe is there already."""
    zoo = vk.zoo.models_dir() if zoo is None else zoo
    wanted = {p.name.split("_", 1)[1]: p for p in sweep.glob("[0-9][0-9][0-9]_*.json")}
    with tempfile.TemporaryDirectory() as tmp:
        unpacked = Path(tmp)
        for part in parts:
            with tarfile.open(part) as tar:
                tar.extractall(unpacked, filter="data")
        names = sorted(c.stem for c in unpacked.glob("*.json"))
        for name in names:
            _check_run(unpacked, name, wanted)
            for target in (zoo / f"{name}.json", recipes / f"{name}.json"):
                if target.exists():
                    raise FileExistsError(f"{target} exists: {name} is in the zoo already.")
        zoo.mkdir(parents=True, exist_ok=True)
        for name in names:
            for suffix in (".safetensors", ".json"):
                shutil.copyfile(unpacked / f"{name}{suffix}", zoo / f"{name}{suffix}")
            shutil.copyfile(wanted[f"{name}.json"], recipes / f"{name}.json")
    if names:
        write_models_readme(zoo)
    return names


def _check_run(folder: Path, name: str, wanted: dict[str, Path]) -> None:
    """Raise ValueError unless model ``name`` in ``folder`` is a run of its sweep recipe with
    an intact checkpoint."""
    if f"{name}.json" not in wanted:
        raise ValueError(f"{name} is not a run of this sweep (its recipes: {len(wanted)}).")
    weights = folder / f"{name}.safetensors"
    if not weights.is_file():
        raise ValueError(f"{name}: the card came without its checkpoint.")
    card = json.loads((folder / f"{name}.json").read_text())
    recipe = load_recipe(wanted[f"{name}.json"])
    differ = [key for key, mine, theirs in (
        ("name", card["name"], recipe["name"]),
        ("architecture", card["architecture"], recipe["architecture"]),
        ("kwargs", card["kwargs"], recipe["kwargs"]),
        ("data", card["data"]["name"], recipe["data"]),
        ("init", card["init"], recipe.get("init", [])),
        *((f"train.{k}", card["recipe"].get(k), v) for k, v in recipe["train"].items()),
    ) if mine != theirs]  # fmt: skip
    if differ:
        raise ValueError(f"{name}: its card differs from the sweep's recipe in {differ}.")
    if vk.zoo.sha256(weights) != card["sha256"]:
        raise ValueError(f"{name}: the checkpoint's sha256 is not its card's (a broken copy).")


def main(argv: list[str]) -> int:
    if argv[:1] == ["list"]:
        for name, groups in SWEEPS.items():
            extensions = [e for group in groups for e in group]
            missing = {r["name"] for r in sweep_recipes(name)}
            todo = [(e, sum(r["name"] in missing for r in e.recipes())) for e in extensions]
            hours = sum(k * e.minutes() for e, k in todo) / 60
            print(f"{name}: {len(missing)} runs to train, about {hours:.1f} hours at their "
                  "bases' card times (one run at a time)")  # fmt: skip
            for e, k in todo:
                print(f"  {e.base}{e.suffix} seeds {e.seeds.start}-{e.seeds.stop - 1}: {e.rows}; "
                      f"{k} to train, about {e.minutes():.0f} min each")  # fmt: skip
        return 0
    if len(argv) == 3 and argv[0] == "write":
        paths = write(argv[1], Path(argv[2]))
        print(f"{len(paths)} recipes in {argv[2]}")
        return 0
    if len(argv) == 3 and argv[0] == "pack":
        paths = pack(Path(argv[1]), Path(argv[2]))
        print(f"packed {', '.join(p.name for p in paths) or 'nothing'} in {argv[2]}")
        return 0
    if len(argv) >= 3 and argv[0] == "adopt":
        names = adopt(Path(argv[1]), [Path(p) for p in argv[2:]])
        print(f"adopted {len(names)} models: {', '.join(names)}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
