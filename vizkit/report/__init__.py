"""`vizkit report`: every analysis that applies to a model, on one self-contained HTML page."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

from tqdm.auto import tqdm

from .inputs import DEFAULT_MODEL, ReportInputs, load_inputs
from .page import write_page
from .sections import SECTIONS, NotApplicable, Section

__all__ = ["DEFAULT_MODEL", "ReportInputs", "Section", "build_report", "load_inputs"]


def build_report(
    model: str = DEFAULT_MODEL,
    data: str | None = None,
    n: int = 8,
    out: str | Path = "report",
    checkpoint: str | None = None,
    device: str = "cpu",
    progress: bool = True,
) -> Path:
    """Run every section of `SECTIONS` that applies to the model on ``n`` images of ``data``
    and write ``<out>/index.html``; return its path.

    Args:
        model: a zoo name, a timm name (with ``checkpoint``: your .safetensors) or a zoo-style
            checkpoint path with its card beside it.
        data: "shapes", "digits" or an image folder (default: the zoo model's data).
        device: where the model runs.
    """
    inputs = load_inputs(model, data, n, checkpoint, device)
    inputs.progress = progress
    sections: list[Section] = []
    skipped: dict[str, str] = {}
    for name, build in tqdm(SECTIONS.items(), desc="report", disable=not progress):
        try:
            sections.append(build(inputs))
        except NotApplicable as reason:
            skipped[name] = str(reason)
        _return_freed_memory()
    return write_page(sections, skipped, f"vizkit report: {inputs.name}", Path(out))


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
