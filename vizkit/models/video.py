"""vizkit's own video architecture for the zoo: a transformers ViViT (Arnab et al. 2021,
Model 1) sized for the Shape clips, carrying the statistics it was trained with.
`VIDEO_BUILDERS` names it for the zoo's cards."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from ..datasets.shapes import SHAPES_MEAN, SHAPES_STD

__all__ = ["VIDEO_BUILDERS", "vivit_clips"]


def vivit_clips(
    num_labels: int, image_size: int = 32, num_frames: int = 4,
    tubelet: Sequence[int] = (2, 8, 8), hidden_size: int = 64, layers: int = 2, heads: int = 4,
    mean: Sequence[float] = SHAPES_MEAN, std: Sequence[float] = SHAPES_STD,
) -> nn.Module:  # fmt: skip
    """A ``VivitForVideoClassification`` of ``layers`` x ``hidden_size`` (MLP twice as wide,
    exact GELU) over clips of ``num_frames`` frames of ``image_size`` pixels cut into
    ``tubelet`` (t, h, w) tubelets; ``pretrained_cfg`` says how its frames are normalized
    (``mean``, ``std`` of [0, 1] pixels), which `vizkit.datasets.load_video` reads."""
    import transformers

    config = transformers.VivitConfig(
        image_size=image_size, num_frames=num_frames, tubelet_size=list(tubelet),
        hidden_size=hidden_size, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=2 * hidden_size, num_labels=num_labels, hidden_act="gelu",
    )  # fmt: skip
    model = transformers.VivitForVideoClassification(config)
    model.pretrained_cfg = {
        "input_size": (3, image_size, image_size), "mean": tuple(mean), "std": tuple(std),
        "crop_pct": 1.0, "interpolation": "bilinear", "num_classes": num_labels,
    }  # fmt: skip
    return model


VIDEO_BUILDERS: dict[str, Callable[..., nn.Module]] = {"vivit_clips": vivit_clips}
