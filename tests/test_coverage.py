"""The coverage table (docs/coverage.md) is generated, complete and current: every timm model
module has a representative, no analysis fails with anything but a clear refusal, and each cell
of the committed table still holds (a family that regresses turns this red)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import vizkit as vk
from vizkit.coverage import ANALYSES, coverage_markdown, run_coverage, run_library_coverage
from vizkit.families import families
from vizkit.models.representatives import FAMILIES, LIBRARIES, timm_families

# the module's fixtures walk every family (about 280 s on 2 busy cores in setup): a guard
# against a hang, above the suite's 300 s per test
pytestmark = pytest.mark.timeout(900)

TABLE = Path(__file__).parent.parent / "docs" / "coverage.md"
REGENERATE = "Regenerate with `vizkit coverage --out docs/coverage.md` and review the diff."


@pytest.fixture(scope="module")
def rows():
    return run_coverage(progress=False)


@pytest.fixture(scope="module")
def libraries():
    return run_library_coverage(progress=False)


def test_every_family_of_another_library_has_a_representative():
    """Each family registered for transformers, torchvision or open_clip is the family of one
    of that library's representatives."""
    for library, models in LIBRARIES.items():
        registered = {f.name for f in families() if f.library == library}
        represented = {vk.HookedModel(m.build()).family.family for m in models.values()}
        assert registered <= represented, (library, registered - represented)


def test_no_analysis_of_another_library_fails_without_a_reason(libraries):
    assert set(libraries) == set(LIBRARIES)  # make test installs every library's extra
    errors = [
        (r.family, n, text)
        for rows in libraries.values()
        for r in rows
        for n, (s, text) in r.results.items()
        if s == "error"
    ]
    assert not errors
    assert not [r.family for rows in libraries.values() for r in rows if r.unfired]


def test_every_timm_family_has_a_representative():
    missing = sorted(set(timm_families()) - set(FAMILIES))
    stale = sorted(set(FAMILIES) - set(timm_families()))
    assert not missing, f"timm model modules without a representative: {missing}"
    assert not stale, f"representatives of modules timm no longer has: {stale}"


def test_no_analysis_fails_without_a_reason(rows):
    errors = [
        (r.family, n, text) for r in rows for n, (s, text) in r.results.items() if s == "error"
    ]
    assert not errors


def test_every_listed_map_is_computed(rows):
    """A map name that never fires would be listed in the manual and refused when asked for."""
    unfired = {r.family: r.unfired for r in rows if r.unfired}
    assert not unfired


def test_committed_table_is_current(rows, libraries):
    committed = _cells(TABLE.read_text())
    current = _cells(coverage_markdown(rows, libraries))
    regressed = [k for k, v in committed.items() if v == "✓" and current.get(k) != "✓"]
    assert not regressed, f"families that no longer work: {regressed}"
    changed = {k: (v, current.get(k)) for k, v in committed.items() if current.get(k) != v}
    assert not changed and committed.keys() == current.keys(), f"{changed}. {REGENERATE}"


def test_adapted_transformer_families_work(rows):
    """The families researchers open most: attention, Grad-CAM, CKA and residual ratios work."""
    by_family = {r.family: r.results for r in rows}
    for family in ("vision_transformer", "eva", "beit", "swin_transformer", "swin_transformer_v2",
                   "deit", "naflexvit", "vision_transformer_relpos"):  # fmt: skip
        for analysis in ("attention", "gradcam", "cka_matrix", "residual_ratios", "explorer"):
            assert by_family[family][analysis][0] == "works", (family, analysis)


def _cells(markdown: str) -> dict[tuple[str, str], str]:
    """(family, analysis) -> "✓" or "✗" from the table rows."""
    cells = {}
    for line in markdown.splitlines():
        parts = [p.strip() for p in line.strip("|").split("|")]
        if len(parts) != 4 + len(ANALYSES) or parts[0] in ("family (timm module)", "model", "---"):
            continue
        for name, cell in zip(ANALYSES, parts[4:], strict=True):
            cells[(parts[0], name)] = "✓" if cell == "✓" else "✗" if re.search("✗", cell) else cell
    return cells
