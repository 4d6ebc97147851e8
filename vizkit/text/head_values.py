"""Each head's values and the output projection, read in the decomposition's one clean forward:
an attention output is o_q = sum_h W_O^h z_h[q] + b_O with z_h[q] = sum_j a_h[q, j] v_h[j], so
with the map a (B, H, N, N), the values v (B, N, H, d) and W_O (C, H d) the head's direct terms
(Gandelsman et al. 2024, Eq. 2-5) are matrix products, with no backward and no forward per
head. Two attention modules are read: torch's ``nn.MultiheadAttention`` (open_clip's and
torchvision's blocks; the values are its input through the value slice of ``in_proj``) and the
modules with ``v_proj`` and ``out_proj`` Linears (transformers' CLIP and SigLIP). Every read is
checked against the block's attention output before it is used (`HeadValues.check`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.linear_head import LinearHead

__all__ = ["HeadValues", "reading_values", "value_projection"]


@dataclass
class HeadValues:
    """One block's attention read in the clean forward.

    Attributes:
        values: (B, N, H, d) each head's value of each source token.
        w_o: (C, H d) the output projection; b_o: (C,) its bias (zeros where it has none).
    """

    values: Tensor
    w_o: Tensor
    b_o: Tensor

    def pooled_terms(self, pattern: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
        """Each head's term W_O^h z_h pooled as the head reads the stream, (B, H, K, C), and
        how each read pools the source tokens through each head's map, (B, H, K, N), for the
        map ``pattern`` (B, H, N, N) and a `LinearHead`'s ``weights`` (B, K, N)."""
        mixing = torch.einsum("bkq,bhqj->bhkj", weights, pattern.float())
        z = torch.einsum("bhkj,bjhd->bhkd", mixing, self.values)
        return torch.einsum("bhkd,chd->bhkc", z, self._w_o(z.shape[1])), mixing

    def check(self, pooled: Tensor, output: Tensor, weights: Tensor) -> float:
        """The largest error of the pooled head terms (B, H, K, C) plus the pooled b_O against
        the attention output (B, N, C) pooled by ``weights`` (B, K, N), relative to the latter's
        largest magnitude."""
        expected = torch.einsum("bkq,bqc->bkc", weights, output.float())
        bias = weights.sum(-1)[..., None] * self.b_o
        scale = expected.abs().max().clamp_min(1e-12)
        return float((pooled.sum(1) + bias - expected).abs().max() / scale)

    def token_terms(self, mixing: Tensor, head: LinearHead) -> Tensor:
        """(B, H, N, D) each head through each source token j, sum_k mixing[k, j] M_k W_O^h
        v_h[j], for the ``mixing`` of `pooled_terms` and the `LinearHead` it pooled by."""
        batch, heads = mixing.shape[:2]
        through = head.through(self._w_o(heads))  # (B or 1, K, H, D, d)
        terms = 0
        for k in range(mixing.shape[2]):
            per_token = torch.einsum("bhdm,bjhm->bhjd", through[:, k].expand(batch, -1, -1, -1),
                                     self.values)  # fmt: skip
            terms = terms + mixing[:, :, k, :, None] * per_token
        return terms

    def _w_o(self, heads: int) -> Tensor:
        return self.w_o.unflatten(1, (heads, -1))  # (C, H, d)


@contextmanager
def reading_values(model: nn.Module, attention: dict[str, str]) -> Iterator[dict]:
    """Hooks that fill ``{block: HeadValues}`` for each block's attention module
    (``attention``: block path -> the module's path) during one forward inside the context;
    a block whose module is neither kind is left out (its heads are read another way)."""
    read: dict[str, HeadValues] = {}
    with ExitStack() as stack:
        for block, path in attention.items():
            module = model.get_submodule(path)
            hook = _reader(module, block, read)
            if hook is not None:
                stack.callback(hook.remove)
        yield read


def _reader(module: nn.Module, block: str, read: dict):
    """The hook handle that reads ``module``'s values into ``read[block]``, None where the
    module is of neither kind."""
    if isinstance(module, nn.MultiheadAttention):
        if not module.batch_first or module.bias_k is not None or module.add_zero_attn:
            return None  # sequence-first tokens, or keys beside the tokens

        def from_input(mod: nn.MultiheadAttention, args: tuple, kwargs: dict) -> None:
            value = args[2] if len(args) > 2 else kwargs["value"]
            read[block] = _multihead_values(mod, value.detach())

        return module.register_forward_pre_hook(from_input, with_kwargs=True)
    v_proj, out_proj = getattr(module, "v_proj", None), getattr(module, "out_proj", None)
    heads = getattr(module, "num_heads", None)
    if isinstance(v_proj, nn.Linear) and isinstance(out_proj, nn.Linear) and heads:

        def from_projection(mod: nn.Module, args: tuple, output: Tensor) -> None:
            values = output.detach().float().unflatten(-1, (heads, -1))
            read[block] = HeadValues(values, out_proj.weight.detach().float(),
                                     _bias(out_proj))  # fmt: skip

        return v_proj.register_forward_hook(from_projection)
    return None


def value_projection(module: nn.MultiheadAttention) -> tuple[Tensor, Tensor | None]:
    """The weight (H d, C) and bias (H d,) or None that give torch's attention its values."""
    width = module.embed_dim
    if module._qkv_same_embed_dim:
        weight = module.in_proj_weight[2 * width :]
    else:
        weight = module.v_proj_weight
    bias = None if module.in_proj_bias is None else module.in_proj_bias[2 * width :]
    return weight, bias


def _multihead_values(module: nn.MultiheadAttention, value: Tensor) -> HeadValues:
    """The values (B, N, H, d) of torch's attention for its ``value`` input (B, N, C)."""
    weight, bias = value_projection(module)
    values = F.linear(value.float(), weight.detach().float(),
                      None if bias is None else bias.detach().float())  # fmt: skip
    out = module.out_proj
    return HeadValues(values.unflatten(-1, (module.num_heads, -1)), out.weight.detach().float(),
                      _bias(out))  # fmt: skip


def _bias(linear: nn.Linear) -> Tensor:
    if linear.bias is None:
        return torch.zeros(linear.out_features, device=linear.weight.device)
    return linear.bias.detach().float()
