"""`vizkit report`: every analysis that applies to a model, on one self-contained HTML page."""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm.auto import tqdm

from ..hooks.inputs import as_names
from .inputs import DEFAULT_MODEL, ReportInputs, load_inputs
from .page import write_page
from .sections import SECTIONS, NotApplicable, Section

__all__ = [
    "DEFAULT_MODEL",
    "HEAVY_SECTIONS",
    "ReportInputs",
    "Section",
    "build_report",
    "chosen_sections",
    "load_inputs",
]

# sections left out unless asked for: the trust checks (a randomization test per method and
# the further faithfulness scores) cost several times the rest of the report together
HEAVY_SECTIONS = ("evaluation",)


def build_report(
    model: str = DEFAULT_MODEL,
    data: str | None = None,
    n: int = 8,
    out: str | Path = "report",
    checkpoint: str | None = None,
    device: str = "cpu",
    progress: bool = True,
    sections: str | Sequence[str] = "default",
    sae: str | Path | None = None,
) -> Path:
    """Run every section of `SECTIONS` that applies to the model on ``n`` images of ``data``
    and write ``<out>/index.html``; return its path.

    Args:
        model: a zoo name, a timm name (with ``checkpoint``: your .safetensors) or a zoo-style
            checkpoint path with its card beside it.
        data: "shapes", "digits" or an image folder (default: the zoo model's data).
        device: where the model runs.
        sections: "default" (every section but `HEAVY_SECTIONS`), "all", or names of
            `SECTIONS`.
        sae: the folder of a sparse autoencoder of the model (written by
            ``vk.train_sae(..., checkpoint=folder)``): adds the features section.

    With ``progress`` each section's seconds are printed as it ends.
    """
    names = chosen_sections(sections)
    inputs = load_inputs(model, data, n, checkpoint, device)
    inputs.progress = progress
    inputs.sae = None if sae is None else str(sae)
    built: list[Section] = []
    skipped: dict[str, str] = {}
    with tqdm(names, desc="report", disable=not progress) as bar:
        for name in bar:
            start = time.perf_counter()
            try:
                built.append(SECTIONS[name](inputs))
            except NotApplicable as reason:
                skipped[name] = str(reason)
            _return_freed_memory()
            if progress:
                took = time.perf_counter() - start
                bar.write(f"report: {name} took {took:.1f} s", file=sys.stderr)
    return write_page(built, skipped, f"vizkit report: {inputs.name}", Path(out))


def chosen_sections(sections: str | Sequence[str]) -> list[str]:
    """The names of `SECTIONS` that ``sections`` stands for, in the page's order."""
    if sections == "all":
        return list(SECTIONS)
    if sections == "default":
        return [name for name in SECTIONS if name not in HEAVY_SECTIONS]
    sections = as_names("sections", sections)
    if not sections:
        raise ValueError(
            f"sections must be 'default', 'all' or names of {', '.join(SECTIONS)}; got none."
        )
    unknown = [name for name in sections if name not in SECTIONS]
    if unknown:
        raise ValueError(f"Unknown report sections {unknown}; known: {', '.join(SECTIONS)}.")
    return [name for name in SECTIONS if name in sections]


def _return_freed_memory() -> None:
    """Hand the memory a section freed back to the system. glibc keeps freed heap memory for
    reuse, fragmented by the sections' differently sized tensors, so without this each section
    starts from the last one's high-water mark (`benchmarks/report.py` measures the peak). A
    no-op off Linux and where the C library has no ``malloc_trim`` (musl)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
