"""Residual-norm ratios of CaiT's Fig. 4: how much each residual branch adds to the stream.

For block l with input x_l and x'_l = x_l + diag(λ_l) SA(η(x_l)) (Touvron et al. 2021, "Going
deeper with Image Transformers", Sec. 2, Eq. 3-4 and Fig. 4):

    r^SA_l  = ‖diag(λ_l)  SA(η(x_l))‖   / ‖x_l‖
    r^FFN_l = ‖diag(λ'_l) FFN(η(x'_l))‖ / ‖x'_l‖

"scaled" includes LayerScale (λ ≡ 1 without it), "unscaled" leaves it out. In CaiT's
class-attention stage the stream is the class token only, (B, 1, C). A video model's stream is
its clips' space-time tokens. TimeSformer's divided space-time attention adds two steps before
the MLP (``hook_temporal_out``, ``hook_spatial_out``): its attention branch is their sum, what
the attention adds to x_l to give x'_l.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.family import residual_spec
from ..hooks.inputs import check_choice, check_images
from ..hooks.layout import require_per_image
from .result import Result

__all__ = [
    "REDUCTIONS",
    "GammaStats",
    "ResidualRatios",
    "LayerScale",
    "layerscale",
    "layerscale_gammas",
    "layerscale_stats",
    "prenorm_blocks",
    "ratio_uniformity",
    "residual_ratios",
]

REDUCTIONS = ("sample_fro", "per_token", "batch")
DIVIDED_STEPS = ("hook_temporal_out", "hook_spatial_out")  # TimeSformer's divided attention


@dataclass(repr=False)
class GammaStats(Result):
    """LayerScale λ per layer, each (L,): mean |λ|, min, max (1 for blocks without LayerScale)."""

    mean_abs: Tensor
    min: Tensor
    max: Tensor


@dataclass(repr=False)
class ResidualRatios(Result):
    """Branch-to-stream norm ratios per block, each (L,) over ``layers``.

    Attributes:
        layers: block paths (``blocks.{i}``, then CaiT's ``blocks_token_only.{j}``).
        stage: "self-attention" or "class-attention" per layer.
        attn, attn_unscaled: r^SA with and without LayerScale.
        mlp, mlp_unscaled: r^FFN with and without LayerScale.
        resid_norm, resid_mid_norm: ‖x_l‖ and ‖x'_l‖ (the main branch), same reduction.
            Tokens are a clip's space-time tokens for a video model.
        gamma_attn, gamma_mlp: LayerScale statistics; has_layerscale: per layer.
        reduction: "sample_fro" (per-image Frobenius norms over tokens x channels, ratio per
            image, mean over the batch), "per_token" (ratio per token, mean over tokens and
            images) or "batch" (norms over the whole batch tensor).
        layout, image_size: the tokens and (H, W) of the input (``layout.frames``: a clip's
            token frames).
    """

    layers: list[str]
    stage: list[str]
    attn: Tensor
    attn_unscaled: Tensor
    mlp: Tensor
    mlp_unscaled: Tensor
    resid_norm: Tensor
    resid_mid_norm: Tensor
    gamma_attn: GammaStats
    gamma_mlp: GammaStats
    has_layerscale: list[bool]
    reduction: str
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    @property
    def options(self) -> dict:
        return {"reduction": self.reduction}

    def rows(self) -> list[dict]:
        """One row per block: stage, r^SA and r^FFN with and without LayerScale."""
        return [
            {"layer": name, "stage": stage, "attn": a, "attn_unscaled": au, "mlp": m,
             "mlp_unscaled": mu}
            for name, stage, a, au, m, mu in zip(
                self.layers, self.stage, self.attn.tolist(), self.attn_unscaled.tolist(),
                self.mlp.tolist(), self.mlp_unscaled.tolist(), strict=True,
            )
        ]  # fmt: skip


@analysis_contract(videos=True)
def residual_ratios(
    model: nn.Module | HookedModel, x: Tensor, reduction: str = "sample_fro"
) -> ResidualRatios:
    """Residual-norm ratios of every pre-norm block (CaiT's Fig. 4), in eval mode (DropPath off).

    Args:
        model: a timm ViT-family model (VisionTransformer with or without LayerScale, Cait), a
            video transformer (ViViT, VideoMAE, TimeSformer: the attention branch of a divided
            block is its temporal and spatial steps together) or a vizkit model with the same
            block names.
        x: image batch (B, C, H, W), or a video model's clips (B, T, C, H, W): the norms run
            over each clip's space-time tokens.
        reduction: "sample_fro" (default), "per_token" or "batch" (see `ResidualRatios`).
    """
    check_choice("reduction", reduction, REDUCTIONS)
    hm = as_hooked(model)
    blocks = prenorm_blocks(hm)
    x = check_images(hm.model, x)
    gamma_attn, gamma_mlp, has_layerscale = layerscale_stats(hm.model, blocks)
    squares: dict[tuple[str, str], Tensor] = {}  # (block, quantity) -> (B, N) squared norms
    fwd: dict[str, list] = {}
    for p in blocks:
        _block_readers(hm, p, len(x), squares, fwd)
    with torch.no_grad(), hm.hooks(fwd=fwd):
        hm(x)

    def series(quantity: str, over: str | None = None) -> Tensor:
        values = []
        for p in blocks:
            top = squares[(p, quantity)]
            bottom = squares[(p, over)] if over else torch.ones_like(top)
            values.append(_reduce(top, bottom, reduction))
        return torch.stack(values).cpu()

    return ResidualRatios(
        layers=blocks,
        stage=["class-attention" if "token_only" in p else "self-attention" for p in blocks],
        attn=series("attn", "x"),
        attn_unscaled=series("attn_unscaled", "x"),
        mlp=series("mlp", "x_mid"),
        mlp_unscaled=series("mlp_unscaled", "x_mid"),
        resid_norm=series("x"),
        resid_mid_norm=series("x_mid"),
        gamma_attn=gamma_attn,
        gamma_mlp=gamma_mlp,
        has_layerscale=has_layerscale,
        reduction=reduction,
        layout=hm.token_layout(tuple(x.shape[-2:])),
        image_size=tuple(x.shape[-2:]),
    )


def _block_readers(hm: HookedModel, p: str, batch: int, squares: dict, fwd: dict) -> None:
    """Hooks that fill ``squares[(p, quantity)]`` for block ``p``.

    x_l is what the attention branch is added to: ``hook_resid_mid - hook_attn_out``, which is
    the block's input except where the block pools or projects its shortcut (MViTv2, Hiera).
    An unscaled branch is the scaled one divided by its LayerScale λ (exact in eval mode); where
    λ has zeros it is read from the branch module's output instead."""
    pending: dict[str, Tensor] = {}  # the attention branch until the mid stream; raw branches
    # (each popped when read, so no block holds a float64 copy of its activations after it)

    def tokens(activation: Tensor, name: str) -> Tensor:
        require_per_image(name, activation, batch)
        return activation.detach().to(torch.float64).reshape(batch, -1, activation.shape[-1])

    def unscaled(quantity: str, scaled: Tensor, gamma: Tensor | None, name: str) -> Tensor:
        if gamma is None:
            return scaled
        if bool((gamma != 0).all()):
            return scaled / gamma.to(scaled)
        raw = pending.pop(f"raw_{quantity}")  # λ has zeros: the branch module's own output
        if raw.shape != scaled.shape:
            raise ValueError(
                f"{name}: LayerScale λ has zeros and the {quantity} module's output "
                f"{tuple(raw.shape)} is not the branch's {tuple(scaled.shape)}, so the unscaled "
                "branch cannot be read."
            )
        return raw

    def branch(quantity: str, gamma: Tensor | None):
        def read(activation: Tensor, *, name: str) -> None:
            a = tokens(activation, name)
            if quantity == "attn":  # a divided block's steps add up to its attention branch
                a = a + pending["attn"] if "attn" in pending else a
                pending["attn"] = a  # x_l = x'_l - attention branch, at the mid stream
            squares[(p, quantity)] = _sq(a)
            squares[(p, f"{quantity}_unscaled")] = _sq(unscaled(quantity, a, gamma, name))

        return read

    def raw_branch(quantity: str):
        def read(activation: Tensor, *, name: str) -> None:
            pending[f"raw_{quantity}"] = tokens(activation, name)

        return read

    def middle(activation: Tensor, *, name: str) -> None:
        a = tokens(activation, name)
        squares[(p, "x_mid")] = _sq(a)
        squares[(p, "x")] = _sq(a - pending.pop("attn"))

    gammas = dict(zip(("attn", "mlp"), layerscale_gammas(hm.model, p), strict=True))
    names = hm.hook_names()
    for quantity, gamma in gammas.items():
        if gamma is not None and not bool((gamma != 0).all()):
            fwd.setdefault(f"{p}.{quantity}.hook_out", []).append(raw_branch(quantity))
        steps = _attention_steps(p, names) if quantity == "attn" else [f"{p}.hook_mlp_out"]
        for step in steps:
            fwd.setdefault(step, []).append(branch(quantity, gamma))
    fwd.setdefault(f"{p}.hook_resid_mid", []).append(middle)


def _attention_steps(block: str, names: list[str]) -> list[str]:
    """The names whose sum is ``block``'s attention branch: ``hook_attn_out``, or divided
    space-time attention's two steps (TimeSformer), in the order they run; [] for neither."""
    for steps in (("hook_attn_out",), DIVIDED_STEPS):
        if all(f"{block}.{step}" in names for step in steps):
            return [f"{block}.{step}" for step in steps]
    return []


def _sq(tokens: Tensor) -> Tensor:
    return tokens.square().sum(-1)


def _reduce(top: Tensor, bottom: Tensor, reduction: str) -> Tensor:
    """Ratio of norms from squared token norms (B, N) of branch and stream."""
    if reduction == "sample_fro":
        return (top.sum(1) / bottom.sum(1)).sqrt().mean()
    if reduction == "per_token":
        return (top / bottom).sqrt().mean()
    return (top.sum() / bottom.sum()).sqrt()


def layerscale_stats(
    model: nn.Module | HookedModel, blocks: list[str] | None = None
) -> tuple[GammaStats, GammaStats, list[bool]]:
    """LayerScale statistics of the attention and FFN branches of ``blocks`` (default: every
    pre-norm block), and whether each block has LayerScale. Reads parameters only."""
    hm = as_hooked(model)
    blocks = prenorm_blocks(hm) if blocks is None else blocks
    gammas = [layerscale_gammas(hm.model, p) for p in blocks]
    return (
        _gamma_stats([g[0] for g in gammas]),
        _gamma_stats([g[1] for g in gammas]),
        [g[0] is not None for g in gammas],
    )


def prenorm_blocks(hm: HookedModel) -> list[str]:
    """Paths of the two-branch residual blocks whose branches and stream vizkit reads
    (``<block>.hook_attn_out``, or divided attention's two steps, and the rest), in forward
    order; raises if the model has none or also has blocks whose branches vizkit cannot read
    (a ratio curve with holes would mislead).
    """
    names = hm.hook_names()
    blocks = [n.removesuffix(".hook_resid_pre") for n in names if n.endswith(".hook_resid_pre")]
    complete = [p for p in blocks if _attention_steps(p, names)]
    if not blocks:
        raise ValueError(
            f"residual_ratios needs transformer blocks with a residual stream; "
            f"{type(hm.model).__name__} has none that vizkit knows (docs/coverage.md lists the "
            "families)."
        )
    if len(complete) < len(blocks):
        missing = [p for p in blocks if p not in complete]
        raise ValueError(
            f"residual_ratios needs two-branch residual blocks (x + attn, then x + mlp) whose "
            f"branches vizkit can read; {type(hm.model).__name__} has {len(complete)} such "
            f"blocks of {len(blocks)} (not readable: {', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}). Blocks with more branches (XCiT's local "
            "patch interaction) have no such pair of ratios."
        )
    return complete


@dataclass(repr=False)
class LayerScale(Result):
    """LayerScale's diag(λ) (CaiT Eq. 1) of every pre-norm block, read from the parameters.

    Attributes:
        layers: block paths (``blocks.{i}``, then CaiT's ``blocks_token_only.{j}``).
        attn, mlp: per block the (C,) λ of that branch, None where the block has none.
    """

    layers: list[str]
    attn: list[Tensor | None]
    mlp: list[Tensor | None]


def layerscale(model: nn.Module | HookedModel) -> LayerScale:
    """LayerScale λ of every pre-norm block's two branches (parameters only, no forward).

    Raises:
        ValueError: the model has no LayerScale at all.
    """
    hm = as_hooked(model)
    blocks = prenorm_blocks(hm)
    gammas = [layerscale_gammas(hm.model, p) for p in blocks]
    if not any(g is not None for pair in gammas for g in pair):
        raise ValueError(f"{type(hm.model).__name__} has no LayerScale parameters.")
    attn, mlp = ([None if g is None else g.detach().float().cpu().clone() for g in side]
                 for side in zip(*gammas, strict=True))  # fmt: skip
    return LayerScale(blocks, attn, mlp)


def layerscale_gammas(model: nn.Module, path: str) -> tuple[Tensor | None, Tensor | None]:
    """LayerScale λ of the attention and FFN branch of a block (None without LayerScale)."""
    block = model.get_submodule(path)
    spec = residual_spec(block)
    if spec is None:
        return None, None
    gammas = (_attribute(block, scale) for scale in spec.scales)
    return tuple(None if g is None else g.detach() for g in gammas)


def _attribute(module: nn.Module, path: str):
    """``module.a.b`` for ``path="a.b"``, None where a step is missing or None."""
    for step in path.split("."):
        module = getattr(module, step, None)
    return module


def _gamma_stats(gammas: list[Tensor | None]) -> GammaStats:
    one = torch.ones(())
    values = [g.detach().float().cpu() if g is not None else one for g in gammas]
    return GammaStats(
        mean_abs=torch.stack([v.abs().mean() for v in values]),
        min=torch.stack([v.min() for v in values]),
        max=torch.stack([v.max() for v in values]),
    )


def ratio_uniformity(entries: list[ResidualRatios], stage: str = "self-attention") -> dict:
    """How uniform the ratios are across the layers of one stage, per entry (e.g. per epoch of
    a tracked history): CaiT's Fig. 4 claim is that LayerScale makes them more uniform
    (`vizkit.ledger.uniformity_contrast` decides it from these).

    Returns:
        ``{"attn": {"cv": [...], "mean": [...]}, "mlp": {...}}``, one value per entry: the
        coefficient of variation (std / mean, population std) across the layers of ``stage``
        and their mean, of the scaled ratios.
    """
    out = {"attn": {"cv": [], "mean": []}, "mlp": {"cv": [], "mean": []}}
    for entry in entries:
        keep = [i for i, s in enumerate(entry.stage) if s == stage]
        if not keep:
            raise ValueError(f"No {stage!r} layers in {entry.layers}.")
        for branch in ("attn", "mlp"):
            values = getattr(entry, branch)[keep].double()
            mean = values.mean()
            out[branch]["mean"].append(mean.item())
            out[branch]["cv"].append((values.std(unbiased=False) / mean).item())
    return out
