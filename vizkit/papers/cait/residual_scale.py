"""What multiplies a residual branch's output before it joins the stream: the strategies that
CaiT's Fig. 1 / Table 1 compare (CaiT, Touvron et al. 2021, § 2, Eqs. 3-4)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["RESIDUAL_STRATEGIES", "ResidualScale"]

# strategy -> (per channel?, initial value or None for "eps", keeps the pre-norm)
RESIDUAL_STRATEGIES = {
    "prenorm": None,  # ViT/DeiT, Fig. 1(a): x + F(η(x))
    "rezero": (False, 0.0, False),  # Fig. 1(b): x + α F(x), α = 0, no normalization
    "skipinit": (False, 0.0, True),  # Fig. 1(c): the same scalar with the pre-norm restored
    "fixup": (False, 1.0, True),  # Fig. 1(c): scalar α = 1 (+ Fixup's branch init, see block)
    "layerscale": (True, None, True),  # Fig. 1(d), Eq. 4: x + diag(λ) F(η(x)), λ_i = ε
    "layerscale_zero": (True, 0.0, True),  # Table A.1: LayerScale initialised at 0
}


class ResidualScale(nn.Module):
    """``x * gamma`` with gamma a learnable scalar (shape (1,)) or per-channel vector (dim,),
    or the identity for "prenorm".

    Args:
        dim: channels C of the branch output (..., C).
        strategy: a key of `RESIDUAL_STRATEGIES`.
        eps: LayerScale's initial value (the "layerscale" strategy only).
    """

    def __init__(self, dim: int, strategy: str = "layerscale", eps: float = 1e-5) -> None:
        super().__init__()
        if strategy not in RESIDUAL_STRATEGIES:
            raise ValueError(
                f"Unknown residual strategy {strategy!r}; choose one of "
                f"{list(RESIDUAL_STRATEGIES)}."
            )
        self.strategy = strategy
        spec = RESIDUAL_STRATEGIES[strategy]
        if spec is None:
            self.gamma = None
            return
        per_channel, init, _ = spec
        value = eps if init is None else init
        self.gamma = nn.Parameter(torch.full((dim,) if per_channel else (1,), float(value)))

    def forward(self, x: Tensor) -> Tensor:
        return x if self.gamma is None else x * self.gamma

    def extra_repr(self) -> str:
        return f"strategy={self.strategy!r}"

    @property
    def keeps_norm(self) -> bool:
        spec = RESIDUAL_STRATEGIES[self.strategy]
        return spec is None or spec[2]
