"""Where a test-time register lives in a model: the run of blocks that hold one flat token
stream from the first block on (where the extra token is appended at the input and dropped at
the output), and in each block the MLP's neurons, read as the input of its output projection
(Jiang et al. 2025, "Vision Transformers Don't Need Trained Registers", Sec. 3: the hidden
units after the nonlinearity, e.g. ``mlp.act`` of DINOv2, ``mlp.gelu`` of OpenCLIP; an MLP that
norms its hidden units before the projection, timm's ``scale_mlp_norm``, is read after that
norm)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..hooks import HookedModel, Tap
from ..hooks.selector import select_layers

__all__ = ["RegisterSites", "register_sites"]


@dataclass(frozen=True)
class RegisterSites:
    """The blocks a register passes through, and their MLP neurons.

    Attributes:
        blocks: block paths of the run, in forward order (L).
        linears: per block, the path of its MLP's output projection (its input is the neurons).
        neurons: per block, the number of neurons (the projection's input width).
        prefix_tokens: prefix tokens (class, trained registers) of the run's stream.
        entry: the first block's ``hook_resid_pre`` tap (the register is appended there).
        exit: the last block's ``hook_resid_post`` tap (the register is dropped there).
    """

    blocks: list[str]
    linears: list[str]
    neurons: list[int]
    prefix_tokens: int
    entry: Tap
    exit: Tap

    def select(self, layers, arg: str = "layers") -> list[str]:
        """The block paths ``layers`` names (``layers=`` vocabulary over the run's blocks)."""
        return select_layers(layers, self.blocks, arg=arg, what="blocks")


def register_sites(hm: HookedModel, image_size: tuple[int, int]) -> RegisterSites:
    """The run of flat-stream blocks from the model's first block and their MLP projections.

    Raises:
        ValueError: no registered family, a first block whose tokens sit on a grid or in
            windows (Swin, MViT, PiT: an extra token has no place there), or a block without a
            linear MLP output projection."""
    family = hm.family
    if family is None or not family.blocks:
        raise ValueError(
            f"{type(hm.model).__name__} has no transformer blocks vizkit knows, so it has no "
            "token stream to add a register to (docs/coverage.md lists the families)."
        )
    first = family.blocks[0]
    run = []
    for site in family.blocks:
        flat = not (site.channels_last or site.channels_first or site.grid or site.input_grid)
        same = (site.x_arg, site.tokens, site.prefix_tokens) == (
            first.x_arg, first.tokens, first.prefix_tokens)  # fmt: skip
        if not (flat and same and site.tokens in ("N", "Np")):
            break
        run.append(site.path)
    if not run:
        raise ValueError(
            f"The {family.family} family's first block holds its tokens on a grid or in "
            "windows, not as one flat stream, so an extra token has no place in it; test-time "
            "registers need a ViT-style token stream (ViT, DeiT, DINOv2, CLIP, SigLIP, CaiT)."
        )
    names = set(hm.hook_names())
    missing = [p for p in (f"{run[0]}.hook_resid_pre", f"{run[-1]}.hook_resid_post")
               if p not in names]  # fmt: skip
    if missing:
        raise ValueError(f"The {family.family} family does not name {missing}: no token stream.")
    linears = [_mlp_projection(hm.model, path) for path in run]
    widths = [hm.model.get_submodule(p).in_features for p in linears]
    layout = hm.token_layout(image_size, f"{run[0]}.hook_resid_pre")
    prefix = 0 if layout is None else layout.num_prefix_tokens
    return RegisterSites(run, linears, widths, prefix, hm.tap(f"{run[0]}.hook_resid_pre"),
                         hm.tap(f"{run[-1]}.hook_resid_post"))  # fmt: skip


def _mlp_projection(model: nn.Module, path: str) -> str:
    """The block's MLP output projection: its last ``nn.Linear`` that writes the stream's width
    (timm ``mlp.fc2``, open_clip ``mlp.c_proj``, transformers ``mlp.fc2`` / ``output.dense``,
    torchvision ``mlp.3``); the attention's output projection comes before it in every family
    vizkit knows."""
    block = model.get_submodule(path)
    linears = [(name, m) for name, m in block.named_modules() if isinstance(m, nn.Linear)]
    width = _stream_width(linears)
    found = [(name, m) for name, m in linears if m.out_features == width and "attn" not in name
             and "attention" not in name]  # fmt: skip
    if not found:
        raise ValueError(
            f"Block {path} has no linear MLP output projection (an MLP of convolutions or none), "
            "so its neurons cannot be read; test-time registers need linear MLPs."
        )
    name, projection = found[-1]
    if projection.in_features < width:
        raise ValueError(
            f"The last linear layer writing block {path}'s stream, {name}, reads "
            f"{projection.in_features} features, fewer than the stream's {width}: not an MLP's "
            "output projection (an adapter such as LoRA's?); merge adapters into the weights "
            "first (e.g. peft's merge_and_unload())."
        )
    return f"{path}.{name}"


def _stream_width(linears: list[tuple[str, nn.Linear]]) -> int | None:
    """The stream's width: what the block's first linear reads (its attention's projection of
    the normed stream)."""
    return linears[0][1].in_features if linears else None
