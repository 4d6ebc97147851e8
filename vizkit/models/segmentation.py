"""vizkit's own segmentation architecture for the zoo: a transformers DPT (Ranftl et al. 2021,
"Vision Transformers for Dense Prediction", Sec. 3: a ViT encoder, its tokens reassembled at
four resolutions and fused by a convolutional decoder) sized for the Shapes masks, carrying the
statistics it was trained with. `SEGMENTATION_BUILDERS` names it for the zoo's cards."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from ..datasets.shapes import SHAPES_MEAN, SHAPES_STD

__all__ = ["SEGMENTATION_BUILDERS", "dpt_masks"]


def dpt_masks(
    num_labels: int, image_size: int = 32, patch_size: int = 8, hidden_size: int = 48,
    layers: int = 4, heads: int = 4, neck: Sequence[int] = (16, 24, 48, 48), fusion: int = 24,
    reassemble: Sequence[float] = (4, 2, 1, 0.5),
    mean: Sequence[float] = SHAPES_MEAN, std: Sequence[float] = SHAPES_STD,
) -> nn.Module:  # fmt: skip
    """A ``DPTForSemanticSegmentation`` of ``layers`` x ``hidden_size`` (MLP twice as wide,
    exact GELU, no auxiliary head) over ``image_size`` pixels in ``patch_size`` patches. Its
    decoder reassembles the last four blocks' tokens into ``neck`` channels each, their grids
    resized by ``reassemble`` (Sec. 3, "Reassemble": the paper's factors), and fuses them at
    ``fusion`` channels; it returns logits (B, ``num_labels``, h, h), h = 4 ``reassemble[0]``
    ``image_size`` / ``patch_size`` (64 by default; transformers' post-processing resizes
    them to the image). ``pretrained_cfg`` says how its images are normalized (``mean``,
    ``std`` of [0, 1] pixels)."""
    import transformers

    if layers < 4:
        raise ValueError(
            f"layers must be at least 4: DPT's decoder reads four blocks; got {layers}."
        )
    config = transformers.DPTConfig(
        image_size=image_size, patch_size=patch_size, hidden_size=hidden_size,
        num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=2 * hidden_size,
        hidden_act="gelu", backbone_out_indices=list(range(layers - 4, layers)),
        neck_hidden_sizes=list(neck), fusion_hidden_size=fusion, num_labels=num_labels,
        reassemble_factors=list(reassemble), use_auxiliary_head=False,
    )  # fmt: skip
    model = transformers.DPTForSemanticSegmentation(config)
    model.pretrained_cfg = {
        "input_size": (3, image_size, image_size), "mean": tuple(mean), "std": tuple(std),
        "crop_pct": 1.0, "interpolation": "bilinear", "num_classes": num_labels,
    }  # fmt: skip
    return model


SEGMENTATION_BUILDERS: dict[str, Callable[..., nn.Module]] = {"dpt_masks": dpt_masks}
