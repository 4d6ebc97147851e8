"""A ViT with a planted circuit: weights set so that one known path decides the class and the
other components compute but write where nothing reads, so that the circuit a method recovers
can be scored against the truth (ROC AUC over edges, as Syed, Rager and Conmy 2023 report).

timm's VisionTransformer, 16 px images, patches of 4 (16 tokens and a class token), width 8,
two blocks of two heads, no norms (each would couple every dimension of the stream), the
stream's dimensions given roles:

- 0: each patch's evidence, the mean of its first channel (the patch embedding);
- 1: block 0's head 0 averages dimension 0 over the tokens (uniform attention) into it;
- 3: block 1's MLP writes sign-preserving g(4 s) - g(-4 s) of dimension 1 (g: GELU) into it,
  and the classifier reads the class token's dimension 3 (class 0: +, class 1: -);
- decoys: block 0's head 1 attends by the junk dimension 4 (queries and keys drawn at random)
  and writes its values to 5; block 0's MLP reads the junk dimension 2 and writes to 6; block
  1's attention reads dimension 1, the signal, and writes to 5. Dimension 7 holds the class
  token's constant.

So the true edges of the graph of whole blocks are embed -> block 0's attention, block 0's
attention -> block 1's MLP and block 1's MLP -> output (with heads: block 0's head 0 for its
attention); every other edge's effect is zero whatever the images.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = [
    "PLANTED_EDGES",
    "planted_circuit_vit",
    "planted_edges",
    "planted_images",
    "recovery_auc",
]

PLANTED_EDGES = (
    ("embed", "blocks.0 attn in"),
    ("blocks.0 attn", "blocks.1 mlp in"),
    ("blocks.1 mlp", "output"),
)
PLANTED_HEAD = "blocks.0 head 0"  # block 0's attention where the graph has heads


def planted_circuit_vit(seed: int = 0) -> nn.Module:
    """The planted-circuit ViT (module docstring) in eval mode; ``seed`` draws the decoys'
    weights."""
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(
        img_size=16, patch_size=4, num_classes=2, embed_dim=8, depth=2, num_heads=2,
        mlp_ratio=1.0, norm_layer=nn.Identity, pos_embed="none", qkv_bias=True,
    ).eval()  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.patch_embed.proj.weight[0, 0] = 1 / 16  # the mean of the first channel
        for junk in (2, 4):
            model.patch_embed.proj.weight[junk] = torch.randn(3, 4, 4, generator=generator)
        model.cls_token[0, 0, 7] = 1.0
        first, second = model.blocks
        qkv, proj = first.attn.qkv.weight, first.attn.proj.weight
        qkv[16, 0] = 1.0  # head 0's value reads the evidence; queries and keys zero: uniform
        proj[1, 0] = 1.0
        qkv[4:8, 4] = torch.randn(4, generator=generator) * 3  # head 1: queries, keys by dim 4
        qkv[12:16, 4] = torch.randn(4, generator=generator) * 3
        qkv[20, 4], proj[5, 4] = 1.0, 1.0
        first.mlp.fc1.weight[0, 2], first.mlp.fc2.weight[6, 0] = 1.0, 1.0
        second.attn.qkv.weight[16, 1], second.attn.proj.weight[5, 0] = 1.0, 1.0
        second.mlp.fc1.weight[0, 1], second.mlp.fc1.weight[1, 1] = 4.0, -4.0
        second.mlp.fc2.weight[3, 0], second.mlp.fc2.weight[3, 1] = 1.0, -1.0
        model.head.weight[0, 3], model.head.weight[1, 3] = 1.0, -1.0
    return model


def planted_images(n: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """``n`` images (n, 3, 16, 16) of the planted task, their classes (class 0 where the first
    channel's mean is positive) and counterfactual images that differ only in that channel,
    negated (so of the other class)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 16, 16, generator=generator)
    x[:, 0] += torch.where(torch.arange(n) % 2 == 0, 0.5, -0.5)[:, None, None]
    flipped = x.clone()
    flipped[:, 0] = -x[:, 0]
    labels = (x[:, 0].mean((1, 2)) < 0).long()
    return x, labels, flipped


def planted_edges(upstream: list[str], downstream: list[str]) -> Tensor:
    """(U, D) bool: the planted circuit's edges in a graph of the planted model (by blocks or
    by heads: block 0's attention is its head 0)."""
    truth = torch.zeros(len(upstream), len(downstream), dtype=torch.bool)
    for u, d in PLANTED_EDGES:
        if u not in upstream:
            u = PLANTED_HEAD
        truth[upstream.index(u), downstream.index(d)] = True
    return truth


def recovery_auc(scores: Tensor, truth: Tensor) -> float:
    """ROC AUC of telling the true edges (``truth`` (U, D) bool) from the others by the
    magnitude of ``scores`` (U, D) (NaN: no edge, left out): the chance that a true edge
    scores above a false one, ties counted half (Mann-Whitney)."""
    valid = ~scores.isnan()
    magnitude = scores.abs()[valid].double()
    positive, negative = magnitude[truth[valid]], magnitude[~truth[valid]]
    if not len(positive) or not len(negative):
        raise ValueError("The AUC needs true and false edges among the scored ones.")
    above = (positive[:, None] > negative[None, :]).double()
    ties = (positive[:, None] == negative[None, :]).double()
    return float((above + ties / 2).mean())
