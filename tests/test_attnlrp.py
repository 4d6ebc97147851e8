"""AttnLRP against LXT (the paper authors' package) on torchvision's ViT, with the same rules:
LXT's efficient patches (identity rule on GELU, LayerNorm with its std held constant) and, in the
attention, either its CP-LRP patch or the AttnLRP uniform rule built from its own
`divide_gradient` (1/4 at Q and K, 1/2 at V, as its transformers patch does). And conservation:
with no additive parameters, CP-LRP's input relevance sums to the target logit."""

from __future__ import annotations

import re
import threading

import pytest
import torch
from conftest import build, torchvision_vit
from lxt_oracle import lxt_relevance
from representatives import drawn, representatives

import vizkit as vk
from vizkit import coverage
from vizkit.hooks.gradient_graph import frozen_parameters
from vizkit.hooks.scores import model_logits
from vizkit.hooks.video import running
from vizkit.methods.attnlrp import input_relevance
from vizkit.methods.relevance_rules import relevance_rules

timm = pytest.importorskip("timm")

torchvision = pytest.importorskip("torchvision")


@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
def test_attnlrp_equals_lxt_on_torchvision_vit(attention):
    pytest.importorskip("lxt")
    model, targets = torchvision_vit(), [2, 0, 4]
    x = torch.randn(3, 3, 32, 32)
    gelu = torch.nn.GELU.forward
    theirs = lxt_relevance(model, x, targets, attention)
    assert torch.nn.GELU.forward is gelu  # LXT's patches undone
    ours = vk.attnlrp(model, x, target=targets, attention=attention)
    scale = theirs.abs().max()
    torch.testing.assert_close(ours.extras["relevance"], theirs, rtol=1e-4, atol=1e-5 * scale)
    torch.testing.assert_close(ours.maps, theirs.sum(1), rtol=1e-4, atol=1e-5 * scale)
    assert ours.targets.tolist() == targets and ours.options["attention"] == attention
    assert all(p.grad is None for p in model.parameters())


# parameters a forward adds rather than multiplies, by their own name: biases, position
# embeddings, prefix tokens (and every nn.Embedding's table)
_ADDITIVE = re.compile(r"(^|_)(bias|pos|token|tokens|embedding|embeddings|latent)(_|\d|$)")


def _additive(model):
    tables = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)}
    for name, p in model.named_parameters():
        own = [part for part in name.split(".") if not part.isdigit()][-1]
        if name in tables or _ADDITIVE.search(own):
            yield p


# families whose forward adds constants that no parameter holds, or hides a nonlinearity in one
# fused operation: there the relevance is not conserved
_UNCONSERVED = {
    "gemma4_vit": "its patch embedding rescales the pixels as 2 * (x - 0.5)",
    "xcit": "its positional encoding is a convolution of fixed Fourier features",
    "sot_vit": "its Newton-Schulz iteration of the covariance adds 3I",
    "sequencer": "its LSTMs run as one fused operation, whose gates take their plain gradient",
    # conserved with the table zeroed (2026-12-07)
    "transformers:VideoMAEForVideoClassification": "it adds a copy of its fixed sinusoidal "
    "position table, which no parameter holds",
    # measured 2026-12-07: CP-LRP's sum 0.004 of a mask logit of -0.223; the likely cause, not
    # yet checked by removing it
    "transformers:SamModel (prompted_masks)": "its prompt encoder adds sines and cosines of a "
    "projection of fixed coordinates (the image's positional encoding) to the image embedding",
    # not yet explained (2026-11-28): 10-60 % of the logit is missing with GELU or ReLU, with
    # or without query pooling and mask-unit attention; timm's Hiera conserves
    "transformers:HieraForImageClassification": "unexplained; see the comment above",
}


def _logits(output: object) -> torch.Tensor:
    """The model's class logits (B, K, ...), or a promptable model's masks: the first prompt's
    (B, M, h, w) and their negatives, so that index 1 names a score on every model."""
    masks = getattr(output, "pred_masks", None)
    if masks is None:
        return model_logits(output)
    return torch.cat([masks[:, 0], -masks[:, 0]], 1)


def _relevance_with_additive_parameters(model, x, target):
    """CP-LRP relevance of the images and of the additive parameters (each x * gradient): with
    BatchNorm's running means zeroed the network is homogeneous in (images, additive
    parameters), so the two sum to the target logit."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("running_mean"):
                buffer.zero_()
    x = x.clone().requires_grad_(True)
    with frozen_parameters(model), torch.enable_grad():
        sources = list(_additive(model))
        for p in sources:
            p.requires_grad_(True)
        with relevance_rules("cp", model):
            logits = _logits(model(x))
        score = logits[:, 1].sum()
        grads = torch.autograd.grad(score, [x, *sources], allow_unused=True)
        for p in sources:
            p.requires_grad_(False)
    absorbed = sum(
        float((p * g).sum()) for p, g in zip(sources, grads[1:], strict=True) if g is not None
    )
    return (x * grads[0]).detach(), absorbed, logits[:, 1].detach()


@pytest.mark.slow
@pytest.mark.parametrize(("make", "size"), representatives())
def test_relevance_rules_on_every_family(make, size, request):
    """On each representative of docs/coverage.md: the forward under the rules gives the
    model's own logits, and CP-LRP conserves the logit: the images' relevance and the additive
    parameters' sum to it (to 1e-4 of the images' total |relevance|), except where the model
    adds constants of its own or fuses a nonlinearity (`_UNCONSERVED`)."""
    model = drawn(make)
    x = coverage._images(model, size)[:2]
    with frozen_parameters(model), torch.enable_grad():
        plain = _logits(model(x.clone().requires_grad_(True))).detach()
    class_one = lambda out: _logits(out)[:, 1].reshape(len(x), -1).sum(1)  # noqa: E731
    with running("attnlrp", videos=True):  # as vk.attnlrp runs it (clips of a video model too)
        relevance, output = input_relevance(model, x, class_one)
    assert torch.equal(_logits(output), plain)
    assert torch.isfinite(relevance).all()
    family = request.node.callspec.id.split("-")[-1]
    if family in _UNCONSERVED:
        return
    relevance, absorbed, logits = _relevance_with_additive_parameters(model, x, 1)
    total = relevance.sum() + absorbed
    torch.testing.assert_close(total, logits.sum(), rtol=1e-4, atol=1e-4 * relevance.abs().sum())


def _relevance(fn, *inputs, attention="attnlrp", model=None):
    """Each input's relevance (x * gradient) for fn's output summed, under the rules."""
    inputs = [t.clone().requires_grad_(True) for t in inputs]
    with relevance_rules(attention, model):
        out = fn(*inputs)
    grads = torch.autograd.grad(out.sum(), inputs, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, grads, strict=True)]
    return out.detach(), [(t * g).detach() for t, g in zip(inputs, grads, strict=True)]


def test_rules_follow_the_papers_equations():
    torch.manual_seed(0)
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    out, (rx,) = _relevance(torch.nn.functional.gelu, x)  # identity rule: R_in = R_out
    torch.testing.assert_close(rx, out)
    out, (rx, ry) = _relevance(torch.mul, x, y)  # uniform rule: half to each factor
    torch.testing.assert_close(rx, out / 2)
    torch.testing.assert_close(ry, out / 2)
    out, (rx, ry) = _relevance(torch.matmul, x, y.T)
    torch.testing.assert_close(rx.sum() + ry.sum(), out.sum())
    torch.testing.assert_close(rx.sum(), ry.sum())
    # softmax rule (Prop. 3.1): R_i = x_i (R_j=i - s_i sum_j R_j), with R_j = s_j here
    out, (rx,) = _relevance(lambda t: t.softmax(-1) * 1.0, x)
    s = x.softmax(-1)
    torch.testing.assert_close(rx, x * (s - s * s.sum(-1, keepdim=True)))
    # LayerNorm: the std held constant, so relevance is conserved up to the bias
    norm = torch.nn.LayerNorm(6).eval()
    torch.nn.init.normal_(norm.bias)
    out, (rx,) = _relevance(norm, x)
    torch.testing.assert_close(rx.sum(-1), (out - norm.bias).sum(-1).detach(), atol=1e-5, rtol=1e-5)
    # the attention of CP-LRP: only the values take relevance
    q, k, v = (torch.randn(1, 2, 5, 3) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out, (rq, rk, rv) = _relevance(sdpa, q, k, v, attention="cp")
    assert not rq.any() and not rk.any()
    torch.testing.assert_close(rv.sum(), out.sum())
    out, (rq, rk, rv) = _relevance(sdpa, q, k, v)  # AttnLRP: 1/4 at Q and K, 1/2 at V
    torch.testing.assert_close(rv.sum(), out.sum() / 2)


@pytest.mark.parametrize("name", ["FastGELUActivation", "NewGELUActivation"])
def test_activations_written_out_of_several_operations_take_the_identity_rule(name):
    """transformers' tanh approximations of GELU are products and sums with constants: given
    the model, the module as a whole takes the identity rule (relevance = its output), which
    the operations' own rules miss; the hooks are gone after."""
    transformers = pytest.importorskip("transformers")
    model = torch.nn.Sequential(torch.nn.Identity(), getattr(transformers.activations, name)())
    x = torch.linspace(-3, 3, 61, dtype=torch.float64)
    x = x[x != 0]
    out, (relevance,) = _relevance(model, x, model=model)
    torch.testing.assert_close(relevance, out, rtol=1e-12, atol=1e-12)
    _, (parts,) = _relevance(model, x)  # each operation's own rule
    assert (parts - out).abs().max() > 0.05
    assert not any(m._forward_hooks for m in model.modules())


def test_the_rules_hold_in_this_thread_only():
    """A forward in another thread while one thread is inside the rules takes plain
    gradients."""
    model, x = build("vit")

    def input_gradient():
        images = x.clone().requires_grad_(True)
        return torch.autograd.grad(model(images)[:, 1].sum(), images)[0]

    expected = input_gradient()
    entered, release = threading.Event(), threading.Event()

    def hold():
        with relevance_rules():
            entered.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(30)
        got = input_gradient()
    finally:
        release.set()
        holder.join()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_attnlrp_refuses_an_unknown_attention_rule():
    model, x = build("vit")
    with pytest.raises(ValueError, match="attention must be one of"):
        vk.attnlrp(model, x, attention="gamma")
