"""Token layout (prefix tokens, patch grid) read from the model, and input validation."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = [
    "TokenLayout",
    "covers",
    "feature_map_format",
    "require_per_image",
    "token_layout",
    "validate_input",
]


@dataclass(frozen=True)
class TokenLayout:
    """How the token axis of a ViT activation is laid out for one input size.

    Attributes:
        num_prefix_tokens: class, distillation and register tokens before the patches.
        grid: patch grid (gh, gw), row-major.
        class_token: whether prefix token 0 is a class token (not a register or nothing).
        frames: the token frames T' of a video's patches (its frames over the tubelet's
            depth), frame-major: T' x gh x gw patches; None for an image.
    """

    num_prefix_tokens: int
    grid: tuple[int, int]
    class_token: bool = False
    frames: int | None = None

    @property
    def cells(self) -> tuple[int, ...]:
        """The patches' axes: (gh, gw) for an image, (T', gh, gw) for a video."""
        return self.grid if self.frames is None else (self.frames, *self.grid)

    @property
    def num_patches(self) -> int:
        return math.prod(self.cells)

    def patch_coordinates(self) -> Tensor:
        """(Np, 3) long: each patch's (frame, row, col), in token order (frame 0 for images)."""
        axes = [torch.arange(n) for n in (self.frames or 1, *self.grid)]
        return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_patches

    def split(self, tokens: Tensor, dim: int = 1) -> tuple[Tensor, Tensor]:
        """Split (..., N, ...) along ``dim`` into prefix (..., num_prefix, ...) and patches
        (..., Np, ...)."""
        if tokens.shape[dim] != self.num_tokens:
            raise ValueError(
                f"Expected {self.num_tokens} tokens ({self.num_prefix_tokens} prefix + "
                f"{'x'.join(map(str, self.cells))} patches) on dim {dim}; got shape "
                f"{tuple(tokens.shape)}."
            )
        return tokens.split([self.num_prefix_tokens, self.num_patches], dim=dim)

    def to_grid(self, patch_values: Tensor) -> Tensor:
        """Reshape (..., Np) to (..., gh, gw), for a video (..., T', gh, gw)."""
        if patch_values.shape[-1] != self.num_patches:
            raise ValueError(
                f"Expected {self.num_patches} patch values on the last axis for grid "
                f"{self.cells}; got shape {tuple(patch_values.shape)}."
            )
        return patch_values.unflatten(-1, self.cells)


def _patch_embed(model: nn.Module) -> nn.Module | None:
    pe = getattr(model, "patch_embed", None)
    return pe if pe is not None and hasattr(pe, "patch_size") else None


def _embedding_owner(model: nn.Module) -> nn.Module:
    """``model``, or where it has no timm patch embedding, the first module inside it that has
    one (a timm ViT held in a wrapper: open_clip's ``TimmModel``, a user's backbone)."""
    if _patch_embed(model) is not None:
        return model
    return next((m for m in model.modules() if _patch_embed(m) is not None), model)


def has_class_token(model: nn.Module) -> bool:
    """Whether the model learns a class token (``cls_token``; CrossViT: one per branch)."""
    return any(name.split(".")[-1].startswith("cls_token") for name, _ in model.named_parameters())


def token_layout(model: nn.Module, image_size: tuple[int, int]) -> TokenLayout | None:
    """Token layout of ``model`` for an (H, W) input, or None if the model has no patch embedding.

    The grid comes from ``patch_embed`` (``dynamic_feat_size`` for dynamic-size models), the
    prefix count from ``model.num_prefix_tokens``; nothing assumes 14x14 or one class token.
    """
    size = tuple(image_size) if isinstance(image_size, (tuple, list, torch.Size)) else None
    if size is None or len(size) != 2 or not all(_positive_int(s) for s in size):
        raise ValueError(f"image_size must be (H, W), two positive ints; got {image_size!r}.")
    pe = _patch_embed(model)
    if pe is None:
        return None
    if getattr(model, "dynamic_img_size", False) or not getattr(pe, "strict_img_size", True):
        grid = tuple(pe.dynamic_feat_size(tuple(image_size)))
    elif hasattr(pe, "grid_size"):
        grid = tuple(pe.grid_size)
    else:  # XCiT's convolutional embedding
        grid = tuple(s // p for s, p in zip(image_size, _pair(pe.patch_size), strict=True))
    prefix = int(getattr(model, "num_prefix_tokens", 0))
    class_token = prefix > 0 and getattr(model, "cls_token", None) is not None
    return TokenLayout(prefix, (int(grid[0]), int(grid[1])), class_token)


def _positive_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else tuple(size)


def _in_channels(model: nn.Module) -> int | None:
    """The image channels the model takes, where its modules say so: the patch embedding's
    convolution (not behind a CNN backbone), else the first convolution when it takes 1-4
    channels (a wider one sits behind a space-to-depth stem or a backbone: no check)."""
    pe = _patch_embed(model)
    if (
        pe is not None
        and isinstance(getattr(pe, "proj", None), nn.Conv2d)
        and getattr(pe, "backbone", None) is None
    ):
        return pe.proj.in_channels
    first_conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    if first_conv is None or first_conv.in_channels > 4:
        return None
    return first_conv.in_channels


def validate_input(model: nn.Module, x: Tensor) -> None:
    """Raise a ValueError naming the expected shape if ``model`` cannot take the image batch ``x``.

    Checks rank (B, C, H, W), the channel count of the first convolution, and, for patch-embedding
    models, that (H, W) is the fixed size or (for dynamic sizes) a multiple of the patch size.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"Expected an image batch tensor (B, C, H, W); got {type(x).__name__}.")
    channels = _in_channels(model)
    expected = f"(B, {channels if channels else 'C'}, H, W)"
    if x.ndim != 4:
        raise ValueError(
            f"Expected an image batch of shape {expected}; got {tuple(x.shape)}."
            + _rank_hint(x, channels)
        )
    if channels is not None and x.shape[1] != channels:
        last = x.shape[-1] == channels
        hint = " It looks channels-last (B, H, W, C): pass x.permute(0, 3, 1, 2)." if last else ""
        raise ValueError(
            f"The model takes {channels}-channel images {expected}; got "
            f"{x.shape[1]} channels in shape {tuple(x.shape)}.{hint}"
        )
    model = _embedding_owner(model)
    pe = _patch_embed(model)
    if pe is None or getattr(pe, "img_size", None) is None:
        return
    hw, (ph, pw) = tuple(x.shape[-2:]), _pair(pe.patch_size)
    if getattr(pe, "strict_img_size", True) and not getattr(model, "dynamic_img_size", False):
        if hw != tuple(pe.img_size):
            h, w = pe.img_size
            raise ValueError(
                f"The model was built for {h}x{w} inputs, shape (B, {x.shape[1]}, {h}, "
                f"{w}); got {hw[0]}x{hw[1]}. Resize the images to {h}x{w} "
                "(vk.datasets.load_images(files, model) does it), or create the model for "
                f"their size: {_size_argument(hw, (ph, pw))}."
            )
    elif not getattr(pe, "dynamic_img_pad", False) and (hw[0] % ph or hw[1] % pw):
        raise ValueError(
            f"Input size {hw[0]}x{hw[1]} is not a multiple of the patch size "
            f"{ph}x{pw}; resize to multiples of it or create the model with "
            "dynamic_img_pad=True."
        )


def _rank_hint(x: Tensor, channels: int | None) -> str:
    """How to turn a batch of the wrong rank into (B, C, H, W), where the shape tells."""
    if x.ndim == 3 and channels is not None and x.shape[-1] == channels != x.shape[0]:
        return " It looks like one channels-last image (H, W, C): x.permute(2, 0, 1)[None]."
    if x.ndim == 3:
        return " Add the batch axis with x.unsqueeze(0)."
    if x.ndim == 2:
        return " It looks like one grey image (H, W): x[None, None] (and repeat the channels)."
    if x.ndim == 5:
        return (
            " A batch of videos (B, T, C, H, W)? This model takes images as far as vizkit "
            "knows: docs/coverage.md lists the video models it covers (VideoMAE, ViViT, "
            "TimeSformer with divided or joint attention, V-JEPA 2)."
        )
    return ""


def _size_argument(hw: tuple[int, int], patch: tuple[int, int]) -> str:
    """The model argument for images of size ``hw``: ``img_size=(H, W)``, after resizing to
    the nearest multiples of the patch size where ``hw`` is not one (the patch embedding would
    cut the remainder off)."""
    rounded = tuple(max(p, round(s / p) * p) for s, p in zip(hw, patch, strict=True))
    multiple = f"multiples of the patch size {patch[0]}x{patch[1]}"
    if rounded == hw:
        return f"img_size={hw} (or dynamic_img_size=True for any {multiple})"
    return (
        f"img_size={rounded}, after resizing the images to {rounded[0]}x{rounded[1]}, "
        f"{multiple} (dynamic_img_size=True takes any such size)"
    )


def covers(h: int, w: int, image_size: tuple[int, int]) -> bool:
    """Whether an h x w map can be a downsampled view of an (H, W) image: no side larger than
    the image's, and the two strides within a factor of 2 of each other."""
    height, width = image_size
    if h > height or w > width:
        return False
    strides = (height / h, width / w)
    return max(strides) <= 2 * min(strides)


def feature_map_format(shape: str, act: Tensor, image_size: tuple[int, int]) -> str:
    """ "NCHW" or "NHWC" for a 4-D activation: its documented shape (``Tap.shape``) where there is
    one, else the only reading whose (h, w) can cover the image.

    Raises:
        ValueError: a documented 4-D shape that is not a feature map, or both readings fit (a
            channel count close to the map's side) and nothing says which is meant.
    """
    if shape.startswith("B C"):
        return "NCHW"
    if shape:
        raise ValueError(f"This activation is {shape}, not a feature map (B, C, h, w).")
    fits = [
        fmt
        for fmt, (h, w) in (("NCHW", act.shape[2:]), ("NHWC", act.shape[1:3]))
        if covers(h, w, image_size)
    ]
    if len(fits) != 1:
        raise ValueError(
            f"Cannot tell whether the {tuple(act.shape)} activation is channels-first (B, C, h, "
            f"w) or channels-last (B, h, w, C) for a {image_size[0]}x{image_size[1]} image. "
            "Pass a block name (<block>.hook_resid_post) or a stage output (<stage>.hook_out)."
        )
    return fits[0]


def require_per_image(name: str, activation: Tensor, batch: int) -> None:
    """Raise a ValueError if ``activation``'s first axis is not the ``batch`` images, e.g. the
    windows of a partitioned attention (B·nW, ...), which have no per-image reading."""
    if activation.shape[0] != batch:
        raise ValueError(
            f"{name} has {activation.shape[0]} items on its batch axis for {batch} images (the "
            "windows of a partitioned attention?), so it has no per-image reading; use the "
            "block's stream (<block>.hook_resid_post) instead."
        )
