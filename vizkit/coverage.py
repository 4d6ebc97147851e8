"""Which analysis works on which timm family: run every analysis on one small representative of
each timm model module (`vizkit.models.representatives`) and record whether it works or is
refused, and why. Only the command line imports it (`vizkit coverage`).

`vizkit coverage --out docs/coverage.md` writes the table; ``tests/test_coverage.py`` runs the same
walk and fails when a family regresses or timm gains a module the table does not cover.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import timm
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from . import analysis, targets
from .hooks import HookedModel
from .hooks.inputs import video_input
from .hooks.layout import covers
from .hooks.scores import is_dense
from .methods import METHODS
from .models.representatives import FAMILIES, LIBRARIES, timm_families

__all__ = ["ANALYSES", "CoverageRow", "coverage_markdown", "run_coverage", "run_library_coverage"]


def _images(model: nn.Module, size: int, batch: int = 4) -> Tensor:
    """``batch`` random images (B, 3, size, size), for a video model clips (B, T, C, H, W)."""
    generator = torch.Generator().manual_seed(0)
    video = video_input(model)
    if video is not None:
        shape = (video.frames, video.channels, *video.size)
        return torch.randn(batch, *shape, generator=generator)
    return torch.randn(batch, 3, size, size, generator=generator)


def _attention(model, x):
    result = analysis.attention(model, x, layers=analysis.stage_layers(model, x.shape[-2:]))
    return f"{len(result.layers)} layers, {tuple(result.patterns.shape[-2:])}"


def _stats(model, x):
    result = analysis.attention(model, x, layers=analysis.stage_layers(model, x.shape[-2:]))
    stats = result.stats()
    if not all(torch.isfinite(v).all() for v in stats.values()):
        raise AssertionError("non-finite attention statistics")
    return f"{len(stats)} statistics"


def dense_target(model: nn.Module | HookedModel, x: Tensor) -> object:
    """What the walk explains on a dense model (`is_dense`), read from its output on ``x``: class
    0 of a segmentation over the whole output, the mean depth over it, or a promptable model's
    first mask where it is predicted; None (the class the model predicts) for a classifier."""
    model = model.model if isinstance(model, HookedModel) else model
    if not is_dense(model):
        return None
    with torch.no_grad():
        output = model(x)
    whole = torch.ones(x.shape[-2:], dtype=torch.bool)
    for name, target in (("pred_masks", targets.mask_logit()),
                         ("predicted_depth", targets.depth_region(whole))):  # fmt: skip
        if _has(output, name):
            return target
    return targets.segment(0, whole)


def _has(output: object, name: str) -> bool:
    return (name in output) if isinstance(output, dict) else getattr(output, name, None) is not None


def _map(fn: Callable) -> Callable:
    """Run a saliency method and check its map covers the image (never a wrong shape); a dense
    model's map explains `dense_target`."""

    def run(model, x):
        result = fn(model, x, target=dense_target(model, x))
        b, *frames, h, w = result.maps.shape  # a video's (B, T', h, w)
        if b != len(x) or not covers(h, w, tuple(x.shape[-2:])) or len(frames) > 1:
            raise AssertionError(f"map of shape {tuple(result.maps.shape)} for {tuple(x.shape)}")
        if not torch.isfinite(result.maps).all():
            raise AssertionError("non-finite map")
        return "x".join(map(str, (*frames, h, w)))

    return run


def _cka(model, x):
    result = analysis.cka_matrix(model, x, batch_size=len(x), progress=False)
    if not torch.isfinite(result.matrix).all():
        raise AssertionError("non-finite CKA")
    return f"{len(result.layers_a)} layers"


def _residual_ratios(model, x):
    result = analysis.residual_ratios(model, x)
    return f"{len(result.layers)} blocks"


def _token_norms(model, x):
    result = analysis.token_norms(model, x, layers=-1)
    return f"{result.layout.num_prefix_tokens} prefix + {result.patches.shape[-2:]}"


def _token_pca(model, x):
    result = analysis.token_pca(model, x, components=2)
    if not torch.isfinite(result.projections).all():
        raise AssertionError("non-finite projections")
    return f"{result.fitted} tokens"


def _test_time_register(model, x):
    from .registers import register_effect

    result = register_effect(model, x, {0: [0]}, faithfulness=False)
    if not torch.isfinite(result.register_norms).all():
        raise AssertionError("non-finite register")
    grid = "x".join(map(str, result.attention.shape[-2:]))
    return f"{grid} patches + {result.register_norms.shape[1]} register"


def _explorer(model, x):
    from .widgets import AttentionExplorer

    explorer = AttentionExplorer(model.model, x[:2])
    return f"{explorer.layer.max + 1} layers"


# saliency methods the walk leaves out, for their cost on the wide layers of large CNNs (the
# table would take hours); they read the layer Grad-CAM reads, or the image, and are tested on
# the transformer families in tests/test_cam_methods.py and tests/test_gradcam_and_captum.py
NOT_WALKED = {
    "integrated_gradients": "50 forward and backward passes per image",
    "occlusion": "one forward pass per occluded window",
    "scorecam": "one forward pass per channel of the layer",
    "ablationcam": "one forward pass per channel of the layer",
    "smoothgrad": "16 forward and backward passes per image",
    "gradientshap": "16 forward and backward passes per image",
}


def _with_target(method: Callable) -> Callable:
    """``method`` called with the walk's ``target`` where it takes one (EigenCAM, rollout and
    class attention explain no score)."""
    takes = "target" in inspect.signature(getattr(method, "fn", method)).parameters

    def run(model, x, target):
        return method(model, x, target=target) if takes and target is not None else method(model, x)

    return run


def _saliency_columns() -> dict[str, Callable[[nn.Module, Tensor], str]]:
    """One column per saliency method vizkit registers (`vizkit.methods`; not ones a user
    adds, not the random baseline, not `NOT_WALKED`), each run with its defaults and checked to
    cover the image."""
    return {
        name: _map(_with_target(method))
        for name, method in METHODS.items()
        if name != "random"
        and name not in NOT_WALKED
        and method.fn.__module__.startswith("vizkit.")
    }


ANALYSES: dict[str, Callable[[nn.Module, Tensor], str]] = {
    "attention": _attention,
    "attention_stats": _stats,
    **_saliency_columns(),
    "cka_matrix": _cka,
    "residual_ratios": _residual_ratios,
    "token_norms": _token_norms,
    "token_pca": _token_pca,
    "test_time_register": _test_time_register,
    "explorer": _explorer,
}


@dataclass
class CoverageRow:
    """One family's results.

    Attributes:
        family: timm model module; model: the representative; cls: its class name.
        maps: attention maps by kind, e.g. {"self": 12, "position": 12}.
        results: analysis -> ("works", detail) | ("refused", reason) | ("error", message).
        seconds: time for the whole row.
        unfired: map names the model lists but does not compute in a forward (should be none).
    """

    family: str
    model: str
    cls: str
    maps: dict[str, int]
    results: dict[str, tuple[str, str]]
    seconds: float
    unfired: list[str] = field(default_factory=list)


def run_coverage(families: list[str] | None = None, progress: bool = True) -> list[CoverageRow]:
    """Run every analysis of `ANALYSES` on each family's representative (random weights, four
    random images, eval mode). A ValueError or TypeError is a refusal; anything else (or a map
    that cannot cover the image) is an error."""
    unknown = sorted(set(families or ()) - set(timm_families()))
    if unknown:
        raise ValueError(f"No timm model module {unknown}; known: {', '.join(timm_families())}.")
    rows = []
    for family in tqdm(families or timm_families(), desc="coverage", disable=not progress):
        rows.append(_run_family(family))
    return rows


def run_library_coverage(
    libraries: list[str] | None = None, progress: bool = True
) -> dict[str, list[CoverageRow]]:
    """`run_coverage` for the representatives of other libraries (`LIBRARIES`), by library;
    a library that is not installed is left out."""
    unknown = sorted(set(libraries or ()) - set(LIBRARIES))
    if unknown:
        raise ValueError(f"No library {unknown}; known: {', '.join(LIBRARIES)}.")
    out = {}
    for library in libraries or LIBRARIES:
        if importlib.util.find_spec(library) is None:
            continue
        models = LIBRARIES[library].items()
        out[library] = [
            _row(label, None, lambda m=model: m.build(), model.size)
            for label, model in tqdm(models, desc=library, disable=not progress)
        ]
    return out


def _run_family(family: str) -> CoverageRow:
    rep = FAMILIES.get(family)
    if rep is None:
        return CoverageRow(family, "", "", {}, {}, 0.0)

    def build() -> nn.Module:
        return timm.create_model(rep.model, pretrained=False, **rep.kwargs)

    return _row(family, rep.model, build, rep.size)


def _row(family: str, label: str | None, build: Callable[[], nn.Module], size: int) -> CoverageRow:
    """Every analysis of `ANALYSES` on the model ``build`` makes (seeded, eval mode);
    ``label``: the representative's name, default the vizkit family that reads it."""
    start = time.perf_counter()
    torch.manual_seed(0)
    model = build().eval()
    hm = HookedModel(model)
    if label is None:
        label = f"{hm.family.family} family" if hm.family is not None else "no family"
    maps: dict[str, int] = {}
    map_names = []
    for name in hm.hook_names():
        kind = hm.tap(name).kind or ("self" if name.endswith(".attn.hook_pattern") else "")
        if kind:  # (vizkit's own layers declare their maps as HookPoints)
            maps[kind] = maps.get(kind, 0) + 1
            map_names.append(name)
    x = _images(model, size)
    results = {}
    for name, run in ANALYSES.items():
        results[name] = _outcome(run, hm, x)
    return CoverageRow(family, label, type(model).__name__, maps, results,
                       time.perf_counter() - start, _unfired(hm, x, map_names))  # fmt: skip


def _unfired(hm: HookedModel, x: Tensor, names: list[str]) -> list[str]:
    """The listed map names that one forward on ``x`` does not compute."""
    fired, listed = set(), set(names)
    if not names:
        return []
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the names that do not fire are the answer
            with hm.hooks(fwd={listed.__contains__: lambda value, *, name: fired.add(name)}):
                hm(x)
    except RuntimeError as error:
        if "did not fire" not in str(error):
            raise
    return [n for n in names if n not in fired]


def _outcome(run: Callable, hm: HookedModel, x: Tensor) -> tuple[str, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "works", run(hm, x)
    except (ValueError, TypeError) as refusal:
        return "refused", _first_sentence(str(refusal))
    except Exception as error:  # noqa: BLE001 - recorded as a failure of the table
        return "error", f"{type(error).__name__}: {_first_sentence(str(error))}"


def _first_sentence(message: str) -> str:
    message = " ".join(message.split())
    end = _SENTENCE_END.search(message)
    return message if end is None else message[: end.start() + 1]


_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\. ")


def coverage_markdown(
    rows: list[CoverageRow], libraries: dict[str, list[CoverageRow]] | None = None
) -> str:
    """The tables as Markdown: for timm, then each other library, one row per family (model),
    ✓ or a numbered refusal per analysis; the refusal reasons listed below, and the totals."""
    reasons: list[str] = []
    lines = _table("family (timm module)", rows, reasons)
    names = list(ANALYSES)
    works = {n: sum(r.results.get(n, ("",))[0] == "works" for r in rows) for n in names}
    errors = sum(s == "error" for r in rows for s, _ in r.results.values())
    adapted = sum(1 for r in rows if set(r.maps) - {"unplaced", "position", "gate"})
    unplaced = sum(1 for r in rows if set(r.maps) == {"unplaced"})
    total = (
        f"{len(rows)} timm model modules; {adapted} with an adapter (named blocks and maps), "
        f"{unplaced} more with maps as captured, {len(rows) - adapted - unplaced} with no "
        "softmax attention map vizkit reads; works per analysis: "
        + ", ".join(f"{n} {c}" for n, c in works.items())
        + f"; errors: {errors}."
    )
    sections = []
    for library, library_rows in (libraries or {}).items():
        counted = sum(r.results.get(n, ("",))[0] == "works" for r in library_rows for n in names)
        sections += [
            f"## {library}",
            "",
            f"{len(library_rows)} model{'s' * (len(library_rows) != 1)}; {counted} of "
            f"{len(library_rows) * len(names)} analyses work.",
            "",
            *_table("model", library_rows, reasons),
            "",
        ]
    notes = [f"{i + 1}. {reason}" for i, reason in enumerate(reasons)]
    return "\n".join(
        [_HEADER, "## timm", "", total, "", *lines, "", *sections, "## Refusals", "", *notes, ""]
    )


def _table(first: str, rows: list[CoverageRow], reasons: list[str]) -> list[str]:
    """One Markdown table; refusal reasons are numbered in ``reasons`` (shared by tables)."""
    names = list(ANALYSES)
    lines = [
        f"| {first} | class | representative | maps | " + " | ".join(names) + " |",
        "|---|---|---|---|" + "---|" * len(names),
    ]
    for row in rows:
        cells = []
        for name in names:
            status, text = row.results.get(name, ("missing", ""))
            text = text.replace(row.cls, "the model") if row.cls else text
            text = "The" + text[3:] if text.startswith("the model") else text
            if status == "works":
                cells.append("✓")
            else:
                key = f"{'ERROR ' if status == 'error' else ''}{text}"
                if key not in reasons:
                    reasons.append(key)
                cells.append(
                    f"{'**error** ' if status == 'error' else ''}✗{reasons.index(key) + 1}"
                )
        kinds = ", ".join(f"{k} {n}" for k, n in row.maps.items()) or "none"
        lines.append(
            f"| {row.family} | {row.cls} | `{row.model}` | {kinds} | " + " | ".join(cells) + " |"
        )
    return lines


_HEADER = """# Coverage: which analysis works on which family

Generated by `vizkit coverage --out docs/coverage.md` (do not edit by hand); checked by
`tests/test_coverage.py`. One small representative per timm model module, then per family of
Hugging Face transformers, torchvision and open_clip (random weights from small configs, four
random images, eval mode; nothing downloaded); ✓ works, ✗n is refused with reason n below (a
ValueError that says why and what to use instead). "maps" counts the named attention maps by
kind (see `vizkit.hooks.taps.PATTERN_KINDS`). Hierarchical models are analysed on their last
stage where an analysis needs one token grid (`vk.attention` by default gives every stage).
Every registered saliency method has a column except those whose cost on the wide layers of
large CNNs would make the walk take hours: integrated gradients (50 forward and backward passes
per image), SmoothGrad and GradientSHAP (16 each), occlusion (one forward per window), Score-CAM
and Ablation-CAM (one forward per channel); they read the image or the layer Grad-CAM reads.
A dense model's maps explain its whole output (`vizkit.coverage.dense_target`): class 0 of a
segmentation over every pixel, the mean depth, a promptable model's first predicted mask.
"""
