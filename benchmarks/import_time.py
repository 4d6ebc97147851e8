"""`import vizkit` against `import torch, timm`: wall time of fresh interpreters, alternated, and
which optional heavy modules the import loads (they should load on first use).

    python benchmarks/import_time.py --repeats 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

STATEMENTS = {"torch + timm": "import torch, timm", "vizkit": "import vizkit"}
OPTIONAL = ("captum", "sklearn", "IPython", "matplotlib", "ipywidgets", "anywidget", "scipy")


def seconds(statement: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return time.perf_counter() - start


def loaded_optional_modules() -> list[str]:
    probe = f"import sys, vizkit; print([m for m in {OPTIONAL!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.replace("'", '"'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    seconds("import vizkit")  # warm the file cache once
    times: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    for _ in range(args.repeats):  # alternated, so drift hits both alike
        for name, statement in STATEMENTS.items():
            times[name].append(seconds(statement))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{name:<14} median {medians[name]:.2f} s  (min {min(values):.2f}, max "
              f"{max(values):.2f}, {len(values)} runs)")  # fmt: skip
    print(f"vizkit adds {medians['vizkit'] - medians['torch + timm']:+.2f} s to torch + timm")
    print(f"optional modules loaded by `import vizkit`: {loaded_optional_modules() or 'none'}")


if __name__ == "__main__":
    main()
