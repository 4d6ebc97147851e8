"""Where each block's attention computes its heads' queries, keys and values, so the gradient
at the stream can be split into the paths through each head's query, key and value input: the
downstream nodes of the computational graph of Conmy et al. 2023, "Towards Automated Circuit
Discovery for Mechanistic Interpretability", and of its edge attribution (Syed, Rager and Conmy
2023, "Attribution Patching Outperforms Automated Circuit Discovery", Eq. 2).

They are read at the outputs of the projections that make them, through vizkit's hooks: timm's
``Attention`` (one fused ``qkv`` Linear, (B, N, 3 H d) laid out (3, H, d)) and transformers'
attention (``q_proj``, ``k_proj``, ``v_proj``, each (B, N, H d) laid out (H, d)). Torch's fused
``nn.MultiheadAttention`` computes them inside its kernel, where no hook reads them, and is
refused, as is any other attention.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from timm.layers import Attention as TimmAttention
from torch import Tensor, nn

from ..analysis.residual_stream import pattern_name
from ..hooks import HookedModel

__all__ = ["QKVReader", "qkv_readers"]

PATHS = ("query", "key", "value")
SEPARATE = ("q_proj", "k_proj", "v_proj")  # transformers' projections, in PATHS' order


@dataclass(frozen=True)
class QKVReader:
    """One block's queries, keys and values: the outputs of the hooks ``names``, either one
    fused (B, N, 3 H d) laid out (3, H, d) or three (B, N, H d) laid out (H, d), in PATHS'
    order; ``heads`` heads."""

    names: tuple[str, ...]
    heads: int

    def head_gradients(self, gradients: Sequence[Tensor]) -> Iterator[tuple[int, Tensor]]:
        """For the query, key and value in turn, and each head in turn: the index in
        ``names`` of the tensor that holds it and the gradient at that tensor (``gradients``,
        one per name) zero outside the head's slice. 3 H pairs, made one at a time."""
        per_tensor = len(PATHS) // len(self.names)
        for path in range(len(PATHS)):
            index, part = divmod(path, per_tensor)
            parts = gradients[index].unflatten(-1, (per_tensor, self.heads, -1))
            for head in range(self.heads):
                masked = torch.zeros_like(parts)
                masked[..., part, head, :] = parts[..., part, head, :]
                yield index, masked.flatten(-3)


def qkv_readers(hm: HookedModel, blocks: list[str]) -> list[QKVReader]:
    """The `QKVReader` of each of ``blocks``.

    Raises:
        ValueError: a block whose attention is not timm's ``Attention`` or transformers'
            (torch's MultiheadAttention included), or blocks with different head counts;
            qkv=False works there."""
    names = set(hm.hook_names())
    readers = [_reader(hm, block, names) for block in blocks]
    counts = sorted({reader.heads for reader in readers})
    if len(counts) > 1:
        raise ValueError(_refusal("the blocks", f"have different head counts ({counts})"))
    return readers


def _reader(hm: HookedModel, block: str, names: set[str]) -> QKVReader:
    """``block``'s reader, found from the module that gives its attention map."""
    pattern = pattern_name(hm, block)
    if pattern is None:
        raise ValueError(_refusal(block, "has no single attention map to find its attention by"))
    path = pattern.rsplit(".", 1)[0]
    attention = hm.model.get_submodule(path)
    if isinstance(attention, nn.MultiheadAttention):
        raise ValueError(_refusal(
            f"{block}'s attention", "is torch's nn.MultiheadAttention, which computes its "
            "queries, keys and values inside its fused kernel, where no hook reads them"
        ))  # fmt: skip
    if type(attention) is TimmAttention:
        reader = QKVReader((f"{path}.qkv.hook_out",), attention.num_heads)
    elif _is_transformers(attention):
        width = attention.q_proj.out_features
        reader = QKVReader(tuple(f"{path}.{n}.hook_out" for n in SEPARATE),
                           width // attention.head_dim)  # fmt: skip
    else:
        raise ValueError(_refusal(
            f"{block}'s attention", f"({_class_name(attention)}) is neither timm's Attention "
            "nor a transformers attention with q_proj, k_proj and v_proj"
        ))  # fmt: skip
    if not names.issuperset(reader.names):
        raise ValueError(_refusal(f"{block}'s attention", "has projections vizkit does not hook"))
    return reader


def _is_transformers(attention: nn.Module) -> bool:
    """A transformers attention with its query, key and value projections as Linears."""
    return (
        type(attention).__module__.startswith("transformers.")
        and isinstance(getattr(attention, "head_dim", None), int)
        and all(isinstance(getattr(attention, n, None), nn.Linear) for n in SEPARATE)
    )


def _class_name(module: nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def _refusal(where: str, why: str) -> str:
    return (
        f"qkv=True reads each head's query, key and value; {where} {why}, so the edges into "
        "them cannot be read. Use qkv=False: the edges into each block's attention input."
    )
