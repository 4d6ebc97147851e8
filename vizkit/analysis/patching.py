"""Activation patching and ablation on the user's unmodified model.

Patching (Meng et al. 2022, "Locating and Editing Factual Associations in GPT", causal
tracing; Heimersheim and Nanda 2024, "How to use and interpret activation patching"): run the
corrupted images with one activation taken from the clean run, and measure how much of the
clean score comes back, (patched - corrupted) / (clean - corrupted): 1 where that activation
alone carries the difference, 0 where it carries none. Sites: the residual stream entering each
block at each position, each block's attention and MLP output, each head's output.

Ablation: run the images with one component's output replaced by zero, its mean over a
reference batch, or its value on another reference image (resampling), and measure the score's
change (and, with labels, the accuracy's): patching from a constructed reference. Both name
their sites with one vocabulary and build their edits with one builder (`site_edits`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..hooks import HookedModel, Target, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import as_names, check_choice, check_count, check_image_pairs, check_images
from ..hooks.scores import is_score_target, model_logits, target_indices
from .component_edits import Edit, RunScore, edited_scores
from .residual_stream import block_activations, residual_blocks
from .result import Result
from .site_edits import SITES, SiteSource, site_edits

__all__ = [
    "ABLATIONS",
    "SITES",
    "AblationResult",
    "PatchingResult",
    "ablation",
    "activation_patching",
]

ABLATIONS = ("zero", "mean", "resample")


@dataclass(repr=False)
class PatchingResult(Result):
    """How much of the clean score each patched activation restores.

    Attributes:
        blocks: the block paths (rows of every map).
        resid: (B, L, N) restored share, the stream entering each block patched at one
            position; positions: (B, N) the same for the first block alone (the embedded
            tokens); attn, mlp: (B, L) each block's whole output patched; heads: (B, L, H)
            each head's output patched. None where not asked for (``options["sites"]``); NaN
            past a block's own heads (the stages of a hierarchical model differ in heads;
            per-position sites are refused there).
            region: (B, L) the stream entering each block patched at every patch of the
            ``region`` at once.
        clean_score, corrupted_score: (B,) the score on each input; a restored share is NaN
            where they are equal (nothing to restore).
        targets, versus: (B,) the classes of the score (``targets`` logit less ``versus``);
            None for a score target (`vizkit.targets`).
        scores: site -> the raw patched scores, shaped as the maps.
    """

    blocks: list[str]
    clean_score: Tensor
    corrupted_score: Tensor
    targets: Tensor | None
    versus: Tensor | None
    resid: Tensor | None = None
    positions: Tensor | None = None
    attn: Tensor | None = None
    mlp: Tensor | None = None
    heads: Tensor | None = None
    region: Tensor | None = None
    scores: dict[str, Tensor] = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None


@dataclass(repr=False)
class AblationResult(Result):
    """The score's change as each component is ablated.

    Attributes:
        component: a site (`vizkit.analysis.site_edits.SITES`); mode: "zero", "mean",
            "resample".
        labels: one name per ablated component (``"blocks.3 head 2"``, ``"position 17"``,
            ``"blocks.1 position 17"``).
        change: (B, E) ablated score less the clean score, per image and component.
        score: (B,) the clean score; targets, versus: its classes (None for a score target).
        accuracy: (E,) the share of images still classified as ``reference labels`` with each
            component ablated, and ``clean_accuracy`` without; None without labels.
    """

    component: str
    mode: str
    labels: list[str]
    change: Tensor
    score: Tensor
    targets: Tensor | None
    versus: Tensor | None
    accuracy: Tensor | None = None
    clean_accuracy: float | None = None
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def ranking(self) -> list[tuple[str, float]]:
        """Components by mean |change| over the images, largest first: (label, mean change)."""
        mean = self.change.mean(0)
        order = self.change.abs().mean(0).argsort(descending=True).tolist()
        return [(self.labels[i], float(mean[i])) for i in order]


@analysis_contract
def activation_patching(
    model: nn.Module | HookedModel,
    clean: Tensor,
    corrupted: Tensor,
    target: Target = None,
    versus: Target = None,
    sites: tuple[str, ...] = ("resid", "attn", "mlp", "heads"),
    region: Tensor | None = None,
    batch_size: int | None = None,
    progress: bool = True,
) -> PatchingResult:
    """Patch clean activations into the run on ``corrupted`` images, one at a time.

    Args:
        clean, corrupted: (B, C, H, W) pairs of images (another image, the object erased,
            noise added).
        target: the class scored, default the clean prediction; versus: a class whose logit is
            subtracted (the logit difference), default none. Or a score target
            (`vizkit.targets`, e.g. a backbone's ``embedding_norm()`` or ``similar_to(...)``):
            its value is the score, each patched copy scored against its own image's
            reference.
        sites: any of `vizkit.analysis.site_edits.SITES`: "resid" (the stream entering each
            block, per position), "positions" (the stream entering the first block, per
            position), "attn", "mlp" (each block's output), "heads" (each head's output).
        region: (B, H, W) bool pixel masks (an object) or (B, gh, gw) masks of the patch grid:
            also patch the stream entering each block at every patch the region touches, at
            once (the result's ``region``).
        batch_size: images per forward (the patched runs go together, copies of the batch);
            None: as many as 1 GiB holds (measured on one image's forward).
        progress: a progress bar over the patched runs.
    """
    clean, corrupted = check_image_pairs(model.model, clean, corrupted)
    sites = tuple(check_choice("sites", s, tuple(SITES)) for s in as_names("sites", sites))
    blocks = residual_blocks(model)
    clean_acts, clean_out = block_activations(model, clean)
    corrupted_acts, corrupted_out = block_activations(model, corrupted)
    score = RunScore.of(clean_out, target, versus)
    every_image = torch.arange(len(clean), device=clean.device)
    high, low = score(clean_out, every_image), score(corrupted_out, every_image)
    source = SiteSource(clean, clean_acts, lambda values: values)  # the clean run's own
    edits: dict[str, list[Edit]] = {
        site: site_edits(model, site, blocks, corrupted, corrupted_acts, source)[0]
        for site in sites
    }
    if region is not None:
        tokens = _region_tokens(model, region, clean)
        edits["region"] = [Edit(f"{b}.hook_resid_pre",
                                _replace_tokens(tokens, clean_acts[f"{b}.hook_resid_pre"]))
                           for b in blocks]  # fmt: skip
    every = [e for site in edits.values() for e in site]
    patched = edited_scores(model, corrupted, every, score, batch_size, progress, "patching")
    gap = high - low
    restored = ((patched - low) / gap.where(gap != 0, torch.nan)).transpose(0, 1)  # (B, E)
    result = PatchingResult(
        blocks, high, low, score.targets, score.versus, options={"sites": sites},
        layout=model.token_layout(tuple(clean.shape[-2:])), image_size=tuple(clean.shape[-2:]),
    )  # fmt: skip
    start = 0
    for site, made in edits.items():
        part = slice(start, start + len(made))
        counts = [sum(e.name.startswith(f"{b}.") for e in made) for b in blocks]
        single = site in ("attn", "mlp", "region", "positions")
        setattr(result, site, _per_block(restored[:, part], counts, single))
        result.scores[site] = _per_block(patched.transpose(0, 1)[:, part], counts, single)
        start += len(made)
    return result


def _region_tokens(hm: HookedModel, region: Tensor, x: Tensor) -> Tensor:
    """(B, N) bool: the tokens of the patches ``region`` (B, H, W) pixels or (B, gh, gw)
    patches touches (a patch with any pixel in it); prefix tokens never."""
    layout = hm.token_layout(tuple(x.shape[-2:]))
    if layout is None:
        raise ValueError("region needs a model with a patch grid; this one has none.")
    if region.ndim != 3 or len(region) != len(x):
        raise ValueError(
            f"region must be (B, H, W) pixel masks or (B, gh, gw) patch masks for the {len(x)} "
            f"images; got {tuple(region.shape)}."
        )
    grid, pixels = layout.grid, tuple(x.shape[-2:])
    if tuple(region.shape[-2:]) == pixels and pixels != grid:
        cells = (pixels[0] // grid[0], pixels[1] // grid[1])
        region = torch.nn.functional.max_pool2d(region[:, None].float(), cells)[:, 0] > 0
    if tuple(region.shape[-2:]) != grid:
        raise ValueError(
            f"region must be of the images' size {pixels} or the patch grid {grid}; got "
            f"{tuple(region.shape[-2:])}."
        )
    prefix = torch.zeros(len(x), layout.num_prefix_tokens, dtype=torch.bool)
    return torch.cat([prefix, region.bool().flatten(1).cpu()], 1).to(x.device)


def _replace_tokens(tokens: Tensor, value: Tensor) -> Callable[[Tensor], Tensor]:
    def fn(t: Tensor) -> Tensor:  # (B, N, C)
        if t.shape[1] != tokens.shape[1]:
            raise ValueError(
                f"A block's stream has {t.shape[1]} tokens, not the {tokens.shape[1]} of the "
                "patch grid and prefix: region patching needs one token per patch."
            )
        return torch.where(tokens[..., None], value, t)

    return fn


def _per_block(values: Tensor, counts: list[int], single: bool) -> Tensor:
    """(B, L, max(counts)) from (B, sum(counts)) laid out block by block, NaN where a block has
    fewer (the stages of a hierarchical model); (B, L) where each block has one."""
    if single:
        return values
    table = values.new_full((len(values), len(counts), max(counts)), torch.nan)
    start = 0
    for layer, count in enumerate(counts):
        table[:, layer, :count] = values[:, start : start + count]
        start += count
    return table


@analysis_contract
def ablation(
    model: nn.Module | HookedModel,
    x: Tensor,
    component: str = "heads",
    mode: str = "zero",
    reference: Tensor | None = None,
    labels: Tensor | None = None,
    target: Target = None,
    versus: Target = None,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = True,
) -> AblationResult:
    """Ablate each ``component`` in turn and measure the change of the score.

    Args:
        component: a site (`vizkit.analysis.site_edits.SITES`, as `activation_patching`
            names them): "heads" (each head's output), "attn", "mlp" (each block's output),
            "positions" (the stream entering the first block, one token position at a time)
            or "resid" (the stream entering each block, one position at a time).
        mode: "zero"; "mean" (the component's mean over ``reference``, per position); or
            "resample" (its value on a reference image drawn for each image with ``seed``).
        reference: (R, C, H, W) images for "mean" and "resample"; default x.
        labels: (B,) the true classes: the result then has each ablation's accuracy.
        target: the class scored, default each image's prediction; versus: a class whose
            logit is subtracted. Or a score target (`vizkit.targets`), whose value is the
            score (then without ``labels``).
    """
    x = check_images(model.model, x)
    check_choice("component", component, tuple(SITES))
    check_choice("mode", mode, ABLATIONS)
    seed = check_count("seed", seed, 0)
    reference = x if reference is None else check_images(model.model, reference)
    if reference.shape[-2:] != x.shape[-2:]:
        raise ValueError(
            f"reference images must be of the images' size {tuple(x.shape[-2:])}, so that each "
            f"ablated activation has a reference value; got {tuple(reference.shape[-2:])}."
        )
    if labels is not None and is_score_target(target):
        raise ValueError(
            "labels= measures how often the model still predicts each image's class with a "
            "component ablated; a score target (e.g. a backbone's embedding score) has no "
            "classes to predict. Leave labels out: the result's change is the score's."
        )
    blocks = residual_blocks(model)
    acts, output = block_activations(model, x)
    score = RunScore.of(output, target, versus)
    reference_acts = acts if reference is x else block_activations(model, reference)[0]
    draw = torch.randint(len(reference), (len(x),), generator=torch.Generator().manual_seed(seed))

    def replacement(values: Tensor) -> Tensor:  # values (R, ...) of the reference -> (B, ...)
        if mode == "zero":
            return torch.zeros_like(values[:1]).expand(len(x), *values.shape[1:])
        if mode == "mean":
            return values.mean(0, keepdim=True).expand(len(x), *values.shape[1:])
        return values[draw.to(values.device)]

    source = SiteSource(reference, reference_acts, replacement)
    edits, names = site_edits(model, component, blocks, x, acts, source)
    clean = score(output, torch.arange(len(x), device=x.device))

    def score_and_class(out: object, rows: Tensor) -> Tensor:  # (n, 2): the class with labels
        values = score(out, rows)
        if labels is None:
            return values[:, None]
        return torch.stack([values, model_logits(out).argmax(-1).float()], -1)

    runs = edited_scores(model, x, edits, score_and_class, batch_size, progress,
                         f"ablating {component}")  # fmt: skip
    result = AblationResult(
        component, mode, names, (runs[..., 0] - clean).transpose(0, 1), clean, score.targets,
        score.versus,
        options={"seed": seed, "reference_images": len(reference)},
        layout=model.token_layout(tuple(x.shape[-2:])), image_size=tuple(x.shape[-2:]),
    )  # fmt: skip
    if labels is not None:
        logits = model_logits(output)
        labels = target_indices(logits, labels).float()
        result.accuracy = (runs[..., 1] == labels).float().mean(1)
        result.clean_accuracy = float((logits.argmax(-1).float() == labels).float().mean())
    return result
