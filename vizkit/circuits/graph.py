"""The graph circuits are found in: a ViT's residual stream read as nodes that write to it and
inputs that read from it (Elhage et al. 2021, "A Mathematical Framework for Transformer
Circuits"; Conmy et al. 2023, "Towards Automated Circuit Discovery", Sec. 2).

Upstream nodes write to the stream: the embedded tokens ("embed", the stream entering the first
block), each block's attention (as one node, or one per head) and each MLP. Downstream inputs
read it: each block's attention input, its MLP input, and the head ("output", the stream after
the last block). Node u feeds input d when u writes before d reads: an edge (u, d).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ComponentGraph"]


@dataclass(frozen=True)
class ComponentGraph:
    """The nodes and inputs of the blocks ``blocks`` with ``heads[l]`` heads each (None: the
    attention of each block as one node).

    Attributes:
        upstream: node names in stream order: "embed", then per block its heads
            ("blocks.3 head 2") or attention ("blocks.3 attn"), then its MLP ("blocks.3 mlp").
        downstream: input names in stream order: per block "blocks.3 attn in", "blocks.3 mlp
            in", then "output".
    """

    blocks: tuple[str, ...]
    heads: tuple[int, ...] | None = None

    @property
    def upstream(self) -> list[str]:
        names = ["embed"]
        for layer, block in enumerate(self.blocks):
            if self.heads is None:
                names.append(f"{block} attn")
            else:
                names += [f"{block} head {h}" for h in range(self.heads[layer])]
            names.append(f"{block} mlp")
        return names

    @property
    def downstream(self) -> list[str]:
        return [f"{b} {branch} in" for b in self.blocks for branch in ("attn", "mlp")] + ["output"]

    def writes_at(self) -> list[int]:
        """For each upstream node, the position in the stream it writes at: 0 for the
        embedding, 2l + 1 for block l's attention, 2l + 2 for its MLP."""
        places = [0]
        for layer in range(len(self.blocks)):
            count = 1 if self.heads is None else self.heads[layer]
            places += [2 * layer + 1] * count + [2 * layer + 2]
        return places

    def edges(self) -> Tensor:
        """(U, D) bool: node u feeds input d (u writes before d reads). Input d reads the
        stream at position d (block l's attention input at 2l, its MLP input at 2l + 1, the
        output at 2L)."""
        writes = torch.tensor(self.writes_at())
        reads = torch.arange(len(self.downstream))
        return writes[:, None] <= reads[None, :]
