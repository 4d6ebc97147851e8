"""CoaT (Xu et al. 2021, "Co-Scale Conv-Attentional Image Transformers"): its factorized
attention multiplies Q into softmax(K)ᵀ V, a C x C matrix per head, so no map over token pairs
exists. The module has an ``attn_drop`` it never calls; registering it with no site keeps the
generic capture from naming a map that would never fire."""

from __future__ import annotations

from timm.models import coat

from ...hooks.family import Family, register_family

FAMILY = register_family(
    Family("coat", "timm", unplaced={coat.FactorAttnConvRelPosEnc: lambda path, attn, ctx: []})
)
