"""Which activations count as a model's layer representations, and how tokens become examples'
features for CKA."""

from __future__ import annotations

import re

from torch import Tensor

from ..hooks import HookedModel
from ..hooks.inputs import check_choice
from ._model import class_attention_names

__all__ = [
    "TOKEN_MODES",
    "default_representation_layers",
    "representation_layers",
    "token_features",
    "token_stream_layers",
]

TOKEN_MODES = ("flatten", "cls", "mean_patches", "tokens")

_CNN_BLOCK = re.compile(r"^(layer\d+|stages\.\d+\.blocks)\.\d+\.hook_out$")  # ResNet, ConvNeXt...


def default_representation_layers(hm: HookedModel) -> list[str]:
    """`representation_layers`, refusing a model that has none."""
    names = representation_layers(hm)
    if names:
        return names
    known = hm.hook_names()
    raise ValueError(
        f"No default layers for {type(hm.model).__name__} (no <block>.hook_resid_post, "
        "no layer{s}.{i} residual blocks, no feature stages). Pass layers= hook names or a "
        "glob, e.g. "
        f"{known[len(known) // 2]!r}; HookedModel(model).hook_names() lists them."
    )


def representation_layers(hm: HookedModel) -> list[str]:
    """Every block's output, the layers ``cka_matrix(layers=int)`` counts (possibly none):
    ``<block>.hook_resid_post`` of each transformer block (every block of every stage of a
    hierarchical model; CaiT's class-attention stage, a stream of one token, left out), the
    residual blocks ``layer{s}.{i}.hook_out`` of a ResNet (``stages.{s}.blocks.{i}`` of
    ConvNeXt-style models), else the output of every feature stage (timm ``feature_info``) of
    other CNNs if it has more than one."""
    names = hm.hook_names()
    blocks = [n for n in names if n.endswith(".hook_resid_post") and hm.tap(n).shape != "B 1 C"]
    if blocks:
        return blocks
    chosen = [n for n in names if _CNN_BLOCK.match(n)]
    if chosen:
        return chosen
    known = set(names)
    stages = [f"{f['module']}.hook_out" for f in getattr(hm.model, "feature_info", None) or ()]
    stages = [name for name in stages if name in known]
    return stages if len(stages) > 1 else []


def token_stream_layers(hm: HookedModel, image_size: tuple[int, int]) -> list[str]:
    """Every transformer block's output ``<block>.hook_resid_post`` whose tokens lie on a patch
    grid, in forward order; refuses a model with none. Left out: class-attention blocks (CaiT's
    class-only stream; XCiT's, where the patch tokens are not attended) and blocks whose tokens
    are not in raster order (Hiera's unrolled stages)."""
    class_blocks = {n.rsplit(".attn.", 1)[0] for n in class_attention_names(hm)}
    names = [
        n
        for n in hm.hook_names()
        if n.endswith(".hook_resid_post")
        and n.removesuffix(".hook_resid_post") not in class_blocks
        and _on_grid(hm, image_size, n)
    ]
    if not names:
        raise ValueError(
            f"{type(hm.model).__name__} has no transformer blocks whose outputs are tokens on a "
            "patch grid (<block>.hook_resid_post); docs/coverage.md lists the families vizkit "
            "adapts. For a CNN's feature maps use gradcam() or cka_matrix()."
        )
    return names


def _on_grid(hm: HookedModel, image_size: tuple[int, int], name: str) -> bool:
    try:
        return hm.token_layout(image_size, name) is not None
    except ValueError:  # a stage whose tokens are not in raster order refuses a grid
        return False


def token_features(
    activation: Tensor, tokens: str, prefix_tokens: int | None, class_token: bool | None = None
) -> Tensor:
    """The examples' features (n, p) of one activation for CKA.

    Args:
        activation: (B, N, C) tokens, (B, C, H, W) feature maps or (B, C) vectors.
        tokens: "flatten": (B, N·C), every image is one example (the Refiner paper's choice);
            "cls": (B, C) the class token; "mean_patches": (B, C) the mean over patch tokens
            (spatial mean of a feature map); "tokens": (B·N, C), every token is an example.
        prefix_tokens: class/register tokens before the patches of a (B, N, C) activation (None:
            not a token sequence of known layout).
        class_token: whether prefix token 0 is a class token (`TokenLayout.class_token`); False
            for a model whose prefix holds only register tokens, so that "cls" is refused rather
            than reading a register. None: not known (a prefix token is taken as the class
            token).
    """
    check_choice("tokens", tokens, TOKEN_MODES)
    if tokens == "flatten":
        return activation.flatten(1)
    if activation.ndim == 4:  # (B, C, H, W): positions are the tokens, there is no prefix
        if tokens == "cls":
            raise ValueError("tokens='cls': a (B, C, H, W) feature map has no class token.")
        if tokens == "mean_patches":
            return activation.mean((2, 3))
        return activation.flatten(2).transpose(1, 2).flatten(0, 1)
    if activation.ndim != 3:
        raise ValueError(
            f"tokens={tokens!r} needs (B, N, C) tokens or (B, C, H, W) maps; this activation "
            f"is {tuple(activation.shape)}. Use tokens='flatten'."
        )
    prefix = prefix_tokens or 0
    if tokens == "cls":
        if prefix < 1:
            raise ValueError(
                "tokens='cls' but this activation has no class token (CaiT's self-attention "
                "stage holds patches only). Use 'mean_patches' or 'flatten'."
            )
        if class_token is False:
            raise ValueError(
                f"tokens='cls' but this model has no class token: its {prefix} prefix token(s) "
                "are register (or other non-class) tokens, and token 0 is not a summary of the "
                "image. Use tokens='mean_patches' (the mean over patch tokens) or 'flatten'."
            )
        return activation[:, 0]
    if tokens == "mean_patches":
        if activation.shape[1] <= prefix:
            raise ValueError(
                f"tokens='mean_patches' but this activation holds no patch tokens (shape "
                f"{tuple(activation.shape)}, {prefix} prefix tokens), e.g. CaiT's class-attention "
                "stage. Use 'cls' or 'flatten'."
            )
        return activation[:, prefix:].mean(1)
    return activation.flatten(0, 1)
