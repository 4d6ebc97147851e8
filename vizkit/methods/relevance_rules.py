"""LRP rules as gradients (Achtibat et al. 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance
Propagation for Transformers", Sec. 3): inside `relevance_rules`, every operation on the images'
graph keeps its forward value but takes the gradient of its rule, so that a tensor times its
gradient is its relevance (the Gradient x Input form of LRP). No model code is edited or copied:
a `TorchFunctionMode` sees the operations as they run.

Run the forward with the parameters frozen (`frozen_parameters`) and the images requiring grad:
a tensor is input-dependent exactly when it requires grad, which is what the rules look at.

The rules:
- element-wise nonlinearities (GELU, SiLU, tanh, sigmoid, ...): the identity rule (the paper's
  Eq. 9): the relevance passes unchanged, i.e. the gradient is f(x)/x; also where one is
  written out of several operations, as transformers' tanh approximations of GELU
  (``FastGELUActivation``, ``NewGELUActivation``: a product and a sum with a constant, which
  the rules below would not conserve), given the model: its ``transformers.activations``
  modules take the identity rule as a whole;
- products of two input-dependent tensors (matmuls, element-wise products, einsum; in attention
  Q.K^T and A.V): the uniform rule (Eq. 7): each factor takes 1/n of the relevance. In a fused
  attention (scaled_dot_product_attention, torch's MultiheadAttention) that is 1/4 at Q and K
  and 1/2 at V;
- softmax: its own gradient, which is the paper's softmax rule (Prop. 3.1);
- LayerNorm, RMSNorm, GroupNorm and L2 normalisation: the identity rule on the normalisation,
  i.e. the scale (std, rms, norm) held constant; square roots of input-dependent tensors and
  input-dependent divisors are held constant too (hand-written norms, the normaliser of linear
  attention);
- everything else (linear layers, convolutions, sums): its gradient (LRP-0 = LRP-epsilon as
  epsilon -> 0).

``attention="cp"`` is CP-LRP (Ali et al. 2022, "XAI for Transformers: Better Explanations
through Conservative Propagation"): every softmax's output (the attention weights) is held
constant, so no relevance flows through Q and K, only through the values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

__all__ = ["ATTENTION_RULES", "relevance_rules"]

ATTENTION_RULES = {
    "attnlrp": "AttnLRP: softmax rule through Q and K, uniform rule on Q.K^T and A.V",
    "cp": "CP-LRP: the attention weights held constant, relevance through the values only",
}


class _ScaleGradient(torch.autograd.Function):
    """Identity forward (a copy: models write into attention scores in place); the gradient
    times ``factor``."""

    @staticmethod
    def forward(ctx, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.factor, None


class _PassThrough(torch.autograd.Function):
    """``out`` forward (computed without a graph); the gradient at ``x`` is grad * ratio."""

    @staticmethod
    def forward(ctx, x: Tensor, out: Tensor, ratio: Tensor) -> Tensor:
        ctx.save_for_backward(ratio)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (ratio,) = ctx.saved_tensors
        return grad * ratio, None, None


def _scaled(x: Tensor, factor: float) -> Tensor:
    return _ScaleGradient.apply(x, factor) if factor != 1 and x.requires_grad else x


def _arg(args: tuple, kwargs: dict, index: int, name: str, default=None):
    return args[index] if len(args) > index else kwargs.get(name, default)


def _with_gradient_of(exact: Tensor, surrogate: Tensor) -> Tensor:
    """``exact``'s values with ``surrogate``'s gradient (their values agree up to rounding)."""
    return exact.detach() + (surrogate - surrogate.detach())


def _identity_rule(func, args, kwargs):
    """An element-wise f: relevance passes unchanged, the gradient at x is f(x)/x."""
    x = args[0]
    if not (isinstance(x, Tensor) and x.requires_grad):
        return func(*args, **kwargs)
    if kwargs.get("inplace"):
        kwargs = {**kwargs, "inplace": False}
    with torch.no_grad():
        out = func(x.detach(), *args[1:], **kwargs)
        ratio = torch.where(x != 0, out / x, torch.zeros_like(out))
    return _PassThrough.apply(x, out, ratio)


def _written_out_activations(model: nn.Module) -> list[nn.Module]:
    """The element-wise activation modules of ``model`` that transformers writes out of several
    operations (``transformers.activations``: every class there is element-wise)."""
    return [m for m in model.modules() if type(m).__module__ == "transformers.activations"]


def _identity_module(module: nn.Module, args: tuple, out: object) -> Tensor | None:
    """Forward hook: an element-wise activation module's output with the identity rule's
    gradient at its input (`_identity_rule`), whatever operations it computed it with."""
    x = args[0] if args else None
    if not (isinstance(x, Tensor) and x.requires_grad and isinstance(out, Tensor)):
        return None
    if out.shape != x.shape:
        raise RuntimeError(
            f"{type(module).__name__} is not element-wise: {x.shape} -> {out.shape}."
        )
    with torch.no_grad():
        ratio = torch.where(x != 0, out / x, torch.zeros_like(out))
    return _PassThrough.apply(x, out.detach(), ratio)


def _power_rule(func, args, kwargs):
    """x**p with a number p is element-wise: the identity rule."""
    exponent = _arg(args, kwargs, 1, "exponent")
    if isinstance(exponent, Tensor):
        return func(*args, **kwargs)
    return _identity_rule(func, args, kwargs)


def _uniform_rule(operands):
    """A product: each of its n input-dependent factors takes 1/n of the relevance."""

    def rule(func, args, kwargs):
        out = func(*args, **kwargs)
        n = sum(isinstance(a, Tensor) and a.requires_grad for a in operands(args, kwargs))
        return _scaled(out, 1 / n) if n > 1 else out

    return rule


def _held_constant(func, args, kwargs):
    """No gradient through a square root (of a variance, in a hand-written norm), nor, in
    CP-LRP, through a softmax (the attention weights)."""
    x = args[0]
    return func(x.detach(), *args[1:], **kwargs) if isinstance(x, Tensor) else func(*args, **kwargs)


def _constant_divisor(func, args, kwargs):
    """x / y with an input-dependent y (a normaliser): y held constant."""
    divisor = args[1] if len(args) > 1 else kwargs.pop("other")
    if isinstance(divisor, Tensor):
        divisor = divisor.detach()
    return func(args[0], divisor, *args[2:], **kwargs)


def _layer_norm(func, args, kwargs):
    x, shape = args[0], _arg(args, kwargs, 1, "normalized_shape")
    weight, eps = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 4, "eps", 1e-5)
    out = func(*args, **kwargs)
    if not x.requires_grad:
        return out
    dims = tuple(range(-len(shape), 0))
    std = (x.detach().var(dims, unbiased=False, keepdim=True) + eps).sqrt()
    linear = (x - x.mean(dims, keepdim=True)) / std
    return _with_gradient_of(out, linear * weight if weight is not None else linear)


def _rms_norm(func, args, kwargs):
    x, shape = args[0], _arg(args, kwargs, 1, "normalized_shape")
    weight, eps = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "eps")
    out = func(*args, **kwargs)
    if not x.requires_grad:
        return out
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    dims = tuple(range(-len(shape), 0))
    linear = x / (x.detach().pow(2).mean(dims, keepdim=True) + eps).sqrt()
    return _with_gradient_of(out, linear * weight if weight is not None else linear)


def _group_norm(func, args, kwargs):
    x, groups = args[0], _arg(args, kwargs, 1, "num_groups")
    weight, eps = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 4, "eps", 1e-5)
    out = func(*args, **kwargs)
    if not x.requires_grad:
        return out
    grouped = x.reshape(x.shape[0], groups, -1)
    std = (grouped.detach().var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    linear = ((grouped - grouped.mean(-1, keepdim=True)) / std).view_as(x)
    if weight is not None:
        linear = linear * weight.view(1, -1, *([1] * (x.ndim - 2)))
    return _with_gradient_of(out, linear)


def _normalize(func, args, kwargs):
    x = args[0]
    p, dim = _arg(args, kwargs, 1, "p", 2.0), _arg(args, kwargs, 2, "dim", 1)
    eps = _arg(args, kwargs, 3, "eps", 1e-12)
    out = func(*args, **kwargs)
    if not x.requires_grad:
        return out
    norm = x.detach().norm(p, dim, keepdim=True).clamp_min(eps)
    return _with_gradient_of(out, x / norm)


def _attention_rule(attention: str):
    """A fused attention softmax(Q.K^T) V with Q, K, V its first three arguments: the uniform
    rule of Q.K^T at Q and K, that of A.V at the output (so a map the fused call returns, as
    torch's MultiheadAttention does, takes its share, as an unfused one would)."""

    def rule(func, args, kwargs):
        q, k, v = args[:3]
        if attention == "cp":
            return func(q.detach(), k.detach(), v, *args[3:], **kwargs)
        mixing = 0.5 if (q.requires_grad or k.requires_grad) and v.requires_grad else 1.0
        if q.requires_grad and k.requires_grad:
            q, k = _scaled(q, 0.5), _scaled(k, 0.5)
        out = func(q, k, v, *args[3:], **kwargs)
        if isinstance(out, tuple):  # MultiheadAttention: (output, weights)
            return (_scaled(out[0], mixing), *out[1:])
        return _scaled(out, mixing)

    return rule


def _two_operands(args, kwargs):
    return args[:2]


def _einsum_operands(args, kwargs):
    rest = args[1:]
    return rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest


_NONLINEAR = [
    F.gelu, F.silu, F.mish, F.elu, F.selu, F.celu, F.softplus, F.hardswish, F.hardsigmoid,
    F.hardtanh, F.relu6, F.sigmoid, F.tanh, torch.sigmoid, torch.tanh, torch.erf,
    Tensor.sigmoid, Tensor.tanh, Tensor.erf, torch.square, Tensor.square,
]  # fmt: skip
_POWERS = [torch.pow, Tensor.pow, Tensor.__pow__]  # x**p, an element-wise f when p is a number
_PRODUCTS = [
    torch.matmul, Tensor.matmul, Tensor.__matmul__, Tensor.__rmatmul__, torch.bmm, Tensor.bmm,
    torch.mul, Tensor.mul, Tensor.__mul__, Tensor.__rmul__,
]  # fmt: skip
_SQUARE_ROOTS = [torch.sqrt, torch.rsqrt, Tensor.sqrt, Tensor.rsqrt]
_DIVISIONS = [torch.div, Tensor.div, Tensor.__truediv__, torch.true_divide]
_SOFTMAX = [F.softmax, torch.softmax, Tensor.softmax]


def _rules(attention: str) -> dict:
    rules = {f: _identity_rule for f in _NONLINEAR}
    rules |= {f: _power_rule for f in _POWERS}
    rules |= {f: _uniform_rule(_two_operands) for f in _PRODUCTS}
    rules |= {f: _held_constant for f in _SQUARE_ROOTS}
    rules |= {f: _constant_divisor for f in _DIVISIONS}
    if attention == "cp":
        rules |= {f: _held_constant for f in _SOFTMAX}
    rules |= {
        torch.einsum: _uniform_rule(_einsum_operands),
        F.layer_norm: _layer_norm,
        F.rms_norm: _rms_norm,
        F.group_norm: _group_norm,
        F.normalize: _normalize,
        F.scaled_dot_product_attention: _attention_rule(attention),
        F.multi_head_attention_forward: _attention_rule(attention),
    }
    return rules


class relevance_rules(TorchFunctionMode):  # noqa: N801  (used as a context manager)
    """Inside the block, the operations of the forward take their LRP rule's gradient
    (module docstring). ``attention``: a key of `ATTENTION_RULES`. The mode is this thread's
    only: another thread's forward is untouched."""

    def __init__(self, attention: str = "attnlrp", model: nn.Module | None = None) -> None:
        if attention not in ATTENTION_RULES:
            raise ValueError(
                f"attention must be one of {sorted(ATTENTION_RULES)}; got {attention!r}."
            )
        super().__init__()
        self._rules = _rules(attention)
        self._activations = [] if model is None else _written_out_activations(model)
        self._handles: list = []

    def __enter__(self):
        self._handles = [m.register_forward_hook(_identity_module) for m in self._activations]
        try:
            return super().__enter__()
        except BaseException:
            self._remove_hooks()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._remove_hooks()

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rule = self._rules.get(func)
        return func(*args, **kwargs) if rule is None else rule(func, args, kwargs)
