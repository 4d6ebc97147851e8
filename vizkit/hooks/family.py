"""The family registry: what vizkit knows about a model family, registered by the family's own
module (one per family under `vizkit.families`) against the module classes it handles.

The hook core asks this registry and names no family. A class is found by its own registration
or its nearest registered base class (subclasses, e.g. vizkit's or a user's, keep the parent's
layout). Classes of libraries vizkit does not import (transformers, open_clip) are registered by
name, ``"package.module:QualName"``, so registering never imports the library.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from torch import Tensor, nn

from .layout import TokenLayout
from .taps import GridFn, Tap
from .video import VideoInput

__all__ = [
    "AttentionContext",
    "AttentionSite",
    "BlockSite",
    "ClassRef",
    "Family",
    "FamilyLayout",
    "ResidualSpec",
    "attention_site",
    "class_key",
    "families",
    "family_layout",
    "inner_layout",
    "projected",
    "register_family",
    "residual_spec",
    "unplaced_site",
]

ClassRef = type | str  # a class, or "package.module:QualName" of a lazily imported library


@dataclass(frozen=True)
class BlockSite:
    """One transformer block and the layout of its residual stream.

    Attributes:
        path: ``named_modules()`` path of the block.
        x_arg: which positional input is the stream (CaiT's class-attention blocks: 1).
        tokens: axis letter of the stream's tokens: "N" (prefix + patches), "Np" (patches only)
            or "1" (the class token alone).
        prefix_tokens: prefix tokens on that axis where it differs from the model's.
        grid: image (H, W) -> this block's token grid, where it differs from the patch embedding's.
        channels_last: the stream is (B, gh, gw, C); its names hold it as (B, Np, C).
        channels_first: the stream is (B, C, gh, gw); its names hold it as (B, Np, C).
        input_grid: the grid of the block's input, where the block pools.
        token_order: ``to_canonical`` / ``from_canonical`` of a stream whose tokens are held in
            another order than the layout's (TimeSformer's space-major patches).
        forward_children: the block's children in the order its forward runs them, where it
            differs from the order they were registered (hook names follow the forward).
        output_item: which item of a tuple output is the stream, for a block without a
            `ResidualSpec` (one with says it there).
    """

    path: str
    x_arg: int = 0
    tokens: str = "N"
    prefix_tokens: int | None = None
    grid: GridFn | None = None
    channels_last: bool = False
    channels_first: bool = False
    input_grid: GridFn | None = None
    token_order: dict | None = None
    forward_children: tuple[str, ...] = ()
    output_item: int | None = None


@dataclass
class FamilyLayout:
    """The blocks of a model and the taps outside them (embedding, final norm, stage outputs).

    Attributes:
        family: the family's name.
        blocks: one `BlockSite` per block, in forward order.
        extra: taps outside the blocks.
        merges_patches: tokens mix between attention layers only through MLPs and 2 x 2 patch
            merging between stages (Swin), so rollout can follow them across stages.
        head_prefix_tokens: prefix tokens in what an attention head outside the blocks reads
            (a pooling head given the patches only: 0), where it differs from the last block's.
        tokens: image (H, W) -> the model's `TokenLayout`, where it is not read from a timm
            ``patch_embed`` and ``num_prefix_tokens``.
        reads_class_token: whether the head reads the class token alone (None: the model's
            timm ``global_pool`` says).
        root: path of the module the layout describes, inside the model given (set by
            `family_layout` for a registered model held in a wrapper; "" for the model itself).
        readout: the model's head applied to one block's output tokens, (B, N, C) -> (B, K)
            logits (the final norm, the pooling or class-token read, the classifier), where the
            family knows it: what a layer would predict (LeGrad's per-layer score).
        video: the clips a video model takes (its ``tokens`` then lay out T' token frames);
            None for a model of images.
    """

    family: str
    blocks: list[BlockSite] = field(default_factory=list)
    extra: list[Tap] = field(default_factory=list)
    merges_patches: bool = False
    head_prefix_tokens: int | None = None
    tokens: Callable[[tuple[int, int]], TokenLayout] | None = None
    reads_class_token: bool | None = None
    root: str = ""
    readout: Callable[[Tensor], Tensor] | None = None
    video: VideoInput | None = None


@dataclass(frozen=True)
class ResidualSpec:
    """Where a two-branch residual block's quantities are read (child module names).

    Attributes:
        attn_out: child whose output is what the attention branch adds to the stream.
        mlp_out: the same for the MLP branch (equal to ``attn_out`` when one module serves both,
            as CaiT's and ConViT's shared ``drop_path``: then its first and second call).
        mid: child whose input is the stream between the branches.
        scales: attribute paths of the branches' LayerScale diag(λ) (CaiT Eq. 1), read as
            None where the block has none.
        output_item: which item of a tuple output is the stream (MViTv2 returns (x, grid)).
    """

    attn_out: str = "drop_path1"
    mlp_out: str = "drop_path2"
    mid: str = "norm2"
    scales: tuple[str, str] = ("ls1.gamma", "ls2.gamma")
    output_item: int | None = None


@dataclass(frozen=True)
class AttentionContext:
    """Where an attention module sits, for its `AttentionSite`.

    Attributes:
        model: the whole model (for options that live on it, e.g. a shared position bias).
        block: the block module the attention sits in; None outside blocks.
        tokens: the axis letter of its tokens ("N", or "Np" where no prefix token takes part).
        prefix_tokens, grid: the token layout of its stream, as in `BlockSite`.
    """

    model: nn.Module
    block: nn.Module | None = None
    tokens: str = "N"
    prefix_tokens: int | None = None
    grid: GridFn | None = None


# (path, attention module, context) -> the taps of its map(s); [] where it has none to read
AttentionSite = Callable[[str, nn.Module, AttentionContext], list[Tap]]


@dataclass(frozen=True)
class Family:
    """Everything vizkit knows about one family, keyed by the classes it handles.

    Attributes:
        name: the family's name (coverage tables, ``HookedModel.family.family``).
        library: the library that defines its classes ("timm", "transformers", "vizkit", ...).
        models: model class -> function returning its `FamilyLayout` (None for a variant of
            the class the family does not cover).
        blocks: block class -> its `ResidualSpec`.
        attention: attention class -> its `AttentionSite`, called for the modules inside blocks.
        outside_blocks: attention classes also read outside the blocks (pooling heads).
        unplaced: attention class -> site, for models without a layout (maps as captured).
    """

    name: str
    library: str
    models: Mapping[ClassRef, Callable[[nn.Module], FamilyLayout | None]] = field(
        default_factory=dict
    )
    blocks: Mapping[ClassRef, ResidualSpec] = field(default_factory=dict)
    attention: Mapping[ClassRef, AttentionSite] = field(default_factory=dict)
    outside_blocks: tuple[ClassRef, ...] = ()
    unplaced: Mapping[ClassRef, AttentionSite] = field(default_factory=dict)


_REGISTERED: list[Family] = []
_TABLES: dict[str, dict[str, object]] = {
    "models": {}, "blocks": {}, "attention": {}, "outside": {}, "unplaced": {},
}  # fmt: skip
_BUILTINS = "vizkit.families"  # imported on the first lookup: it registers the built-in families


def class_key(cls: ClassRef) -> str:
    """``"package.module:QualName"`` of a class (or the string itself)."""
    if isinstance(cls, str):
        if ":" not in cls:
            raise ValueError(f"A class name must read 'package.module:QualName'; got {cls!r}.")
        return cls
    return f"{cls.__module__}:{cls.__qualname__}"


def register_family(family: Family) -> Family:
    """Add ``family`` to the registry; returns it. Registering a family of the same library and
    name again replaces the earlier one (a notebook cell run twice).

    Raises:
        ValueError: another family already claims one of its classes for the same role.
    """
    same = (family.library, family.name)
    others = [f for f in _REGISTERED if (f.library, f.name) != same]
    roles = _roles(family)
    for role, entries in roles.items():
        for cls in entries:
            owner = next((f for f in others if _claims(f, role, class_key(cls))), None)
            if owner is not None:
                raise ValueError(
                    f"{class_key(cls)} is registered as a {role} class of the {owner.library} "
                    f"family {owner.name!r} already; a class belongs to one family (register a "
                    "subclass for a different layout)."
                )
    _REGISTERED[:] = others + [family]
    for role in _TABLES:
        _TABLES[role].clear()
    for registered in _REGISTERED:
        for role, entries in _roles(registered).items():
            _TABLES[role].update({class_key(cls): value for cls, value in entries.items()})
    return family


def _claims(family: Family, role: str, key: str) -> bool:
    return any(class_key(cls) == key for cls in _roles(family)[role])


def _roles(family: Family) -> dict[str, Mapping]:
    outside = {cls: family.attention.get(cls) for cls in family.outside_blocks}
    if None in outside.values():
        raise ValueError(f"{family.name}: outside_blocks lists classes without an attention site.")
    return {"models": family.models, "blocks": family.blocks, "attention": family.attention,
            "outside": outside, "unplaced": family.unplaced}  # fmt: skip


def families() -> list[Family]:
    """Every registered family, in registration order (built-ins first)."""
    _load_builtins()
    return list(_REGISTERED)


def _load_builtins() -> None:
    if _BUILTINS not in sys.modules:
        importlib.import_module(_BUILTINS)


def _lookup(role: str, module: nn.Module):
    """The entry of the nearest class in ``type(module)``'s MRO registered for ``role``."""
    _load_builtins()
    table = _TABLES[role]
    for cls in type(module).__mro__:
        entry = table.get(f"{cls.__module__}:{cls.__qualname__}")
        if entry is not None:
            return entry
    return None


def family_layout(model: nn.Module) -> FamilyLayout | None:
    """The blocks and extra taps of ``model``'s family, or None for other models.

    A model of no registered family that holds one (a wrapper: ``self.backbone = vit``, an
    ``nn.Sequential(normalize, vit)``, a transformers ``...ForImageClassification``) gets the
    layout of the first registered model among its modules, its paths under that module."""
    layout = _lookup("models", model)
    if layout is not None:
        return layout(model)
    return inner_layout(model)


def inner_layout(model: nn.Module) -> FamilyLayout | None:
    """The layout of the first registered model among ``model``'s modules (not ``model``
    itself), its paths under that module; None where there is none."""
    for path, module in model.named_modules():
        layout = _lookup("models", module) if path else None
        if layout is not None:
            found = layout(module)  # None: a variant the family does not cover
            return None if found is None else _under(found, path)
    return None


def projected(layout: FamilyLayout | None, projection: nn.Module | None) -> FamilyLayout | None:
    """``layout`` with its readout followed by ``projection``: what a model adds after the
    pooled output of the model it holds (transformers' ``visual_projection``)."""
    if layout is not None and layout.readout is not None and projection is not None:
        pooled = layout.readout
        layout.readout = lambda tokens: projection(pooled(tokens))
    return layout


def _under(layout: FamilyLayout, root: str) -> FamilyLayout:
    """``layout`` with every path placed under the module at ``root``."""

    def inside(path: str | None) -> str | None:
        return None if path is None else f"{root}.{path}"

    layout.blocks = [dataclasses.replace(site, path=inside(site.path)) for site in layout.blocks]
    layout.extra = [
        dataclasses.replace(tap, name=inside(tap.name), module=inside(tap.module))
        for tap in layout.extra
    ]
    layout.root = inside(layout.root) if layout.root else root
    return layout


def residual_spec(block: nn.Module) -> ResidualSpec | None:
    """The residual layout of ``block``'s class, or None if no family knows it."""
    return _lookup("blocks", block)


def attention_site(module: nn.Module, *, outside: bool = False) -> AttentionSite | None:
    """How ``module``'s attention map is read (inside a block, or ``outside`` the blocks)."""
    return _lookup("outside" if outside else "attention", module)


def unplaced_site(module: nn.Module) -> AttentionSite | None:
    """How ``module``'s map is read in a model without a layout, if a family says."""
    return _lookup("unplaced", module)
