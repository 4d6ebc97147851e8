"""Model-parameter randomization tests (Adebayo et al., NeurIPS 2018, "Sanity Checks for
Saliency Maps", Sec. 3.1): re-initialize the model's layers, from the top down one after another
(cascading) or one at a time (independent), and measure how similar each method's maps stay to
the trained model's. A method whose maps survive randomization does not explain the model.

The user's model is never touched: the randomized models are copies (`copy.deepcopy`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.result import Result
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice, check_count, check_images
from ..hooks.scores import is_score_target, model_logits, target_indices, target_label
from ..methods.registry import registered
from .similarity import SIMILARITIES

__all__ = [
    "MODES",
    "SanityResult",
    "data_randomization",
    "randomization_layers",
    "sanity_check",
]

MODES = ("cascading", "independent")
OWN = " (own parameters)"  # a layer of the parameters a module holds directly


@dataclass(repr=False)
class SanityResult(Result):
    """The maps of one method as the model's layers are randomized.

    Attributes:
        method: the saliency method; mode: "cascading", "independent" or "data".
        layers: the randomized layers, top first: in a cascading test step s has layers[:s+1]
            randomized, in an independent one layers[s] alone; in the data test, the one step
            ["randomized labels"] (the model trained on them).
        original: (B, h, w) the maps of the trained model.
        maps: (S, B, h, w) the maps after each step.
        similarity: name -> (S, B) similarity of each step's maps to the original ones
            (`vizkit.metrics.similarity.SIMILARITIES`: Spearman of |map| and signed, SSIM,
            HOG correlation); NaN where a map is constant.
        targets: (B,) the classes explained (the trained model's, at every step); None for a
            score target (`vizkit.targets`), whose label ``options["target"]`` holds.
        options: the method's options and the seed.
    """

    method: str
    mode: str
    layers: list[str]
    original: Tensor
    maps: Tensor
    similarity: dict[str, Tensor]
    targets: Tensor | None
    options: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        last = {k: f"{float(v[-1].nanmean()):.2f}" for k, v in self.similarity.items()}
        return (
            f"SanityResult({self.method}, {self.mode}, {len(self.layers)} layers, "
            f"similarity after the last step {last})"
        )


def randomization_layers(model: nn.Module, x: Tensor) -> list[str]:
    """The model's layers in the order a forward on ``x`` runs them, as module paths: the
    family's blocks (`vizkit.hooks.family`) and the largest modules around them that hold
    parameters but no block (embeddings, norms, downsampling, head); parameters held directly by
    the model as ``""``, first, and those held directly by a module around blocks as
    ``"<path> (own parameters)"``. The sanity checks randomize them last first. A module the
    forward does not call (a list of modules, a head whose parts are called one by one) is
    placed where its first part runs, or where the module that holds it does.
    """
    hm = HookedModel(model)
    blocks = {b.path for b in hm.family.blocks} if hm.family is not None else set()
    first_call: dict[str, int] = {}
    handles = [
        module.register_forward_pre_hook(
            lambda m, a, path=path: (
                None if path in first_call else first_call.update({path: len(first_call)})
            )
        )
        for path, module in model.named_modules()
    ]
    try:
        with torch.no_grad():
            model(x[:1])
    finally:
        for handle in handles:
            handle.remove()

    def runs_at(path: str) -> int:  # its first module to run, else the nearest ancestor's
        path = path.removesuffix(OWN)
        inside = [i for p, i in first_call.items() if p == path or p.startswith(f"{path}.")]
        return min(inside) if inside else runs_at(path.rpartition(".")[0]) if path else 0

    holders = sorted(_parameter_holders(model, "", blocks), key=runs_at)
    own = [""] if any(True for _ in model.parameters(recurse=False)) else []
    return own + holders


def _parameter_holders(module: nn.Module, path: str, blocks: set[str]) -> list[str]:
    """Paths under ``module`` (at ``path``) that cover its children's parameters: the blocks,
    and the children that hold parameters but no block; children around blocks are opened."""
    holders = []
    for name, child in module.named_children():
        child_path = f"{path}.{name}" if path else name
        around = any(b.startswith(f"{child_path}.") for b in blocks)
        if child_path in blocks or (not around and any(True for _ in child.parameters())):
            holders.append(child_path)
        elif around:
            if any(True for _ in child.parameters(recurse=False)):
                holders.append(child_path + OWN)  # e.g. a position embedding of the encoder
            holders += _parameter_holders(child, child_path, blocks)
    return holders


def _randomize(model: nn.Module, path: str, generator: torch.Generator) -> None:
    """Re-initialize the parameters of ``path`` ("" for the model's own, "<path> (own
    parameters)" for those a module holds directly): each submodule with
    ``reset_parameters`` as its constructor would, the others drawn from a normal with each
    tensor's mean and standard deviation."""
    whole = bool(path) and not path.endswith(OWN)
    module = model.get_submodule(path.removesuffix(OWN))
    covered: set[int] = set()
    if whole:
        for sub in module.modules():
            if hasattr(sub, "reset_parameters"):
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
                    sub.reset_parameters()
                covered |= {id(p) for p in sub.parameters(recurse=False)}
    with torch.no_grad():
        for p in module.parameters(recurse=whole):
            if id(p) in covered:
                continue
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            p.copy_((noise * p.double().std().nan_to_num() + p.double().mean()).to(p.dtype))


@analysis_contract
def sanity_check(
    model: nn.Module | HookedModel,
    x: Tensor,
    method: str = "gradcam",
    target: Target = None,
    mode: str = "cascading",
    seed: int = 0,
    progress: bool = True,
    **options,
) -> SanityResult:
    """The model-parameter randomization test of ``method`` (a name of `vk.methods.METHODS`)
    on images ``x`` (B, C, H, W).

    Args:
        target: the classes explained: an int, B ints, or None for the trained model's
            predictions; kept at every step (the randomized model's own prediction is noise).
        mode: "cascading" (the layers randomized from the top down, cumulatively) or
            "independent" (one layer at a time, the others trained).
        seed: the randomization's seed (one generator for the whole test).
        progress: a progress bar over the steps.
        options: passed to the method (e.g. ``layer=`` for a CAM).

    Returns:
        `SanityResult`: the maps per step and their similarity to the trained model's.
    """
    hm = model
    x = check_images(hm.model, x)
    check_choice("mode", mode, MODES)
    seed = check_count("seed", seed, 0)
    saliency = registered(method)
    targets = _explained(hm, x, target)
    original = saliency(hm.model, x, targets, **options).maps
    layers = randomization_layers(hm.model, x)
    generator = torch.Generator().manual_seed(seed)
    randomized = copy.deepcopy(hm.model)
    steps = []
    for layer in tqdm(layers[::-1], desc=f"sanity_check {method}", disable=not progress,
                      leave=False):  # fmt: skip
        if mode == "independent":
            randomized = copy.deepcopy(hm.model)
        _randomize(randomized, layer, generator)
        steps.append(saliency(randomized, x, targets, **options).maps)
    maps = torch.stack(steps)
    similarity = {
        name: torch.stack([measure(original, step) for step in maps]).float().cpu()
        for name, measure in SIMILARITIES.items()
    }
    return SanityResult(
        method, mode, layers[::-1], original, maps, similarity, _recorded(targets),
        options={**options, "seed": seed, **_score_option(target)},
    )  # fmt: skip


def _explained(hm: HookedModel, x: Tensor, target: Target) -> Tensor | Target:
    """What every step explains: the trained model's classes (``target``, or its predictions
    for None), kept for the randomized models; a score target as it is."""
    if is_score_target(target):
        return target
    with torch.no_grad():
        return target_indices(model_logits(hm(x)), target)


def _recorded(targets: Tensor | Target) -> Tensor | None:
    return targets.cpu() if isinstance(targets, Tensor) else None


def _score_option(target: Target) -> dict:
    return {"target": target_label(target)} if is_score_target(target) else {}


@analysis_contract
def data_randomization(
    model: nn.Module | HookedModel,
    randomized: nn.Module,
    x: Tensor,
    method: str = "gradcam",
    target: Target = None,
    **options,
) -> SanityResult:
    """The data-randomization test (Adebayo et al. 2018, Sec. 3.2): ``method``'s maps of
    ``model`` and of ``randomized``, the same architecture trained on permuted labels (the zoo's
    ``vit_tiny_shapes_random_labels``), for the same classes (``target``, default the trained
    model's predictions), and their similarity. A method that explains the model gives other
    maps for a model that only memorized."""
    x = check_images(model.model, x)
    saliency = registered(method)
    if type(randomized) is not type(model.model):
        raise TypeError(
            f"randomized must be the model's architecture trained on permuted labels; got a "
            f"{type(randomized).__name__} for a {type(model.model).__name__}."
        )
    targets = _explained(model, x, target)
    original = saliency(model.model, x, targets, **options).maps
    maps = saliency(randomized, x, targets, **options).maps[None]  # eval for the call
    similarity = {
        name: measure(original, maps[0])[None].float().cpu()
        for name, measure in SIMILARITIES.items()
    }
    options = {**options, **_score_option(target)}
    return SanityResult(method, "data", ["randomized labels"], original, maps, similarity,
                        _recorded(targets), options=options)  # fmt: skip
