"""What transformers' tubelet-embedding video models share: clips (B, T, C, H, W) cut by one
``Conv3d`` of kernel = stride (t, ph, pw) into T / t token frames of (H / ph) x (W / pw) patches,
flattened frame-major (the convolution's output (B, C, T', gh, gw) flattened over its last three
axes), after the prefix tokens the embedding adds."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ...hooks.layout import TokenLayout
from ...hooks.video import VideoInput

__all__ = ["tubelet_tokens", "tubelet_video"]


def tubelet_video(embeddings: nn.Module, frames: int) -> VideoInput:
    """The clips of ``frames`` frames a tubelet embedding (``patch_embeddings.projection``, a
    Conv3d) takes, at the frame size it was built for."""
    conv = embeddings.patch_embeddings.projection
    if not isinstance(conv, nn.Conv3d) or conv.kernel_size != conv.stride:
        raise TypeError(
            f"{type(embeddings).__name__}'s patch embedding is not a tubelet convolution "
            "(Conv3d, kernel = stride); this transformers version is not supported."
        )
    size = getattr(embeddings.patch_embeddings, "image_size", None)
    size = getattr(embeddings, "image_size", None) if size is None else size
    size = (size, size) if isinstance(size, int) else tuple(size)
    return VideoInput(int(frames), conv.kernel_size[0], conv.in_channels, size)


def tubelet_tokens(
    embeddings: nn.Module, video: VideoInput, prefix: int
) -> Callable[[tuple[int, int]], TokenLayout]:
    """The token layout of ``video``'s clips: ``prefix`` tokens (a class token, where there is
    one), then T' x gh x gw patches."""
    _, ph, pw = embeddings.patch_embeddings.projection.kernel_size

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        grid = (image_size[0] // ph, image_size[1] // pw)
        return TokenLayout(prefix, grid, prefix > 0, frames=video.token_frames)

    return tokens
