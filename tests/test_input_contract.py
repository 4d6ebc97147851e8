"""The input contract (`vizkit.hooks.inputs`, `vizkit.hooks.contract`): every public analysis
refuses a bad batch, target or option with a clear error and leaves the model as it was; wrapped
and train-mode models give the eval-mode answer; two threads never mix results."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import build
from torch import nn

import vizkit as vk


def _vit() -> nn.Module:
    torch.manual_seed(0)
    return vk.create_model("test_vit", num_classes=5, img_size=32).eval()


def _batch(b: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(1))


# name -> fn(model, x, **options): every public analysis that runs a model on a batch
ANALYSES = {
    "attention": lambda m, x, **k: vk.attention(m, x, **k),
    "rollout": lambda m, x, **k: vk.rollout(m, x, **k),
    "grad_rollout": lambda m, x, **k: vk.grad_rollout(m, x, **k),
    "gradcam": lambda m, x, **k: vk.gradcam(m, x, **k),
    "saliency": lambda m, x, **k: vk.saliency(m, x, **k),
    "integrated_gradients": lambda m, x, **k: vk.integrated_gradients(m, x, **{"n_steps": 4, **k}),
    "occlusion": lambda m, x, **k: vk.occlusion(m, x, **k),
    "residual_ratios": lambda m, x, **k: vk.residual_ratios(m, x, **k),
    "cka_matrix": lambda m, x, **k: vk.cka_matrix(m, x, unbiased=False, progress=False, **k),
    "token_norms": lambda m, x, **k: vk.token_norms(m, x, **k),
    "token_pca": lambda m, x, **k: vk.token_pca(m, x, components=2, **k),
    "deletion": lambda m, x, **k: vk.metrics.deletion(
        m, x, torch.rand(len(x), 4, 4, generator=torch.Generator().manual_seed(0)), steps=4, **k
    ),
}
# every registered saliency method (`vk.methods`) the table above does not name
ANALYSES |= {
    name: lambda m, x, method=method, **k: method(m, x, **k)
    for name, method in vk.methods.METHODS.items()
    if name not in ANALYSES
}
GRADIENT_ANALYSES = [
    name
    for name, method in vk.methods.METHODS.items()
    if method.targets and ("gradients" in method.needs or name == "occlusion")
]

BAD_BATCHES = {
    "no batch axis": (torch.randn(3, 32, 32), ValueError, "unsqueeze|data must be images"),
    "empty batch": (torch.randn(0, 3, 32, 32), ValueError, "empty"),
    "uint8 images": (torch.zeros(2, 3, 32, 32, dtype=torch.uint8), TypeError, "floating-point"),
    "NaN pixel": (
        _batch().index_put_((torch.tensor([1]),), torch.tensor(float("nan"))),
        ValueError,
        r"NaN values \(samples \[1\]",
    ),  # fmt: skip
    "Inf pixel": (
        _batch().clamp(max=float("inf")).mul(torch.tensor([1.0, float("inf")]).view(2, 1, 1, 1)),
        ValueError,
        "Inf",
    ),  # fmt: skip
    "numpy array": (_batch().numpy(), TypeError, "torch.from_numpy|got ndarray"),
    "one channel": (torch.randn(2, 1, 32, 32), ValueError, "3-channel"),
    "not a patch multiple": (torch.randn(2, 3, 30, 32), ValueError, "multiple of the patch"),
}


def _state(model: nn.Module) -> tuple:
    """Everything a call must leave as it was: hooks, fused flags, modes, parameter grads."""
    return (
        [
            (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for m in model.modules()
        ],  # fmt: skip
        [getattr(m, "fused_attn", None) for m in model.modules()],
        [m.training for m in model.modules()],
        [p.grad for p in model.parameters()],
    )


@pytest.mark.parametrize("batch", list(BAD_BATCHES))
@pytest.mark.parametrize("analysis", list(ANALYSES))
def test_bad_batches_are_refused(analysis, batch):
    model = _vit().train()
    before = _state(model)
    x, error, phrase = BAD_BATCHES[batch]
    with pytest.raises(error, match=phrase):
        ANALYSES[analysis](model, x)
    assert _state(model) == before


BAD_TARGETS = {
    "float": (0.9, TypeError, r"got 0\.9"),
    "whole float": (3.0, TypeError, "target must be"),
    "float list": ([0.9, 1.7], TypeError, r"got 0\.9 in"),
    "float tensor": (torch.tensor([1.0, 2.0]), TypeError, r"target\.long\(\)"),
    "bool": (True, TypeError, "target must be"),
    "too many": ([1, 2, 3], ValueError, "3 targets for a batch of 2"),
    "out of range": (5, ValueError, r"valid: 0\.\.4"),
    "string": ("cat", TypeError, "target must be"),
}


@pytest.mark.parametrize("target", list(BAD_TARGETS))
@pytest.mark.parametrize("analysis", GRADIENT_ANALYSES)
def test_bad_targets_are_refused(analysis, target):
    model = _vit()
    value, error, phrase = BAD_TARGETS[target]
    before = _state(model)
    with pytest.raises(error, match=phrase):
        ANALYSES[analysis](model, _batch(), target=value)
    assert _state(model) == before


@pytest.mark.parametrize("target", [np.int64(3), np.array([3, 1]), torch.tensor([3, 1]), (3, 1)])
def test_integer_targets_of_every_kind(target):
    model, x = _vit(), _batch()
    expected = vk.gradcam(model, x, target=[3, 1] if np.ndim(target) else 3).maps
    torch.testing.assert_close(vk.gradcam(model, x, target=target).maps, expected)


BAD_OPTIONS = [
    ("integrated_gradients", {"n_steps": 0}, ValueError, r"n_steps must be an int >= 1; got 0"),
    ("integrated_gradients", {"max_bytes": 0}, ValueError, "max_bytes"),
    ("integrated_gradients", {"baseline": float("nan")}, ValueError, "baseline"),
    ("integrated_gradients", {"baseline": float("inf")}, ValueError, "baseline"),
    ("occlusion", {"baseline": float("-inf")}, ValueError, "baseline"),
    ("integrated_gradients", {"baseline": torch.zeros(5, 5)}, ValueError, "does not broadcast"),
    ("occlusion", {"window": 40}, ValueError, r"up to the image size 32x32"),
    ("occlusion", {"window": 0}, ValueError, "window"),
    ("occlusion", {"stride": (2, 2, 2)}, TypeError, "stride"),
    ("rollout", {"discard_ratio": 1.0}, ValueError, r"discard_ratio must be in \[0, 1\)"),
    ("rollout", {"heads": "median"}, ValueError, "'mean', 'max', 'min'"),
    ("attention", {"layers": 7}, (ValueError, IndexError), "7"),
    ("attention", {"maps": "raw"}, ValueError, "'softmax', 'applied'"),
    ("attention", {"max_bytes": 0}, ValueError, "max_bytes must be an int >= 1"),
    ("cka_matrix", {"batch_size": 0}, ValueError, "batch_size"),
    ("cka_matrix", {"bandwidth": -1.0, "kernel": "rbf"}, ValueError, "bandwidth"),
    ("deletion", {"batch_size": 0}, ValueError, "batch_size"),
]


@pytest.mark.parametrize("analysis, options, error, phrase", BAD_OPTIONS)
def test_bad_options_are_refused(analysis, options, error, phrase):
    model = _vit()
    before = _state(model)
    with pytest.raises(error, match=phrase):
        ANALYSES[analysis](model, _batch(), **options)
    assert _state(model) == before


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_other_float_dtypes_are_cast_to_the_model_dtype(dtype):
    model, x = _vit(), _batch()
    expected = vk.attention(model, x).patterns
    torch.testing.assert_close(
        vk.attention(model, x.to(dtype)).patterns, expected, atol=2e-3, rtol=0
    )


@pytest.mark.parametrize("analysis", list(ANALYSES))
def test_train_mode_gives_the_eval_answer_and_is_restored(analysis):
    """A dropout model in train mode (as timm creates it): every analysis runs in eval mode."""
    torch.manual_seed(0)
    model = vk.create_model(
        "test_vit", num_classes=5, img_size=32, drop_rate=0.5, attn_drop_rate=0.5,
        proj_drop_rate=0.5, drop_path_rate=0.5,
    )  # fmt: skip
    model.blocks[0].norm1.eval()  # a module in its own mode must keep it
    x = _batch()
    before = _state(model)
    first = ANALYSES[analysis](model, x)
    assert _state(model) == before
    expected = ANALYSES[analysis](model.eval(), x)
    tensors = [n for n, v in vars(first).items() if isinstance(v, torch.Tensor)]
    assert tensors
    for name in tensors:
        torch.testing.assert_close(getattr(first, name), getattr(expected, name))


def test_attention_rows_sum_to_one_in_train_mode():
    model = vk.create_model("test_vit", img_size=32, attn_drop_rate=0.5).train()
    sums = vk.attention(model, _batch()).patterns.sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums))


def test_hooked_model_warns_once_about_train_mode():
    hm = vk.HookedModel(vk.create_model("test_vit", img_size=32, attn_drop_rate=0.1).train())
    with pytest.warns(UserWarning, match="training mode, so dropout act"):
        hm.run_with_cache(_batch(), names="blocks.0.attn.hook_pattern")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hm.run_with_cache(_batch(), names="blocks.0.attn.hook_pattern")


@pytest.mark.parametrize(
    "wrap", [torch.compile, nn.DataParallel], ids=["torch.compile", "DataParallel"]
)
def test_wrapped_models_are_unwrapped(wrap):
    model, x = _vit(), _batch()
    expected = vk.attention(model, x).patterns
    wrapped = wrap(model)
    torch.testing.assert_close(vk.attention(wrapped, x).patterns, expected)
    torch.testing.assert_close(vk.gradcam(wrapped, x).maps, vk.gradcam(model, x).maps)
    assert vk.HookedModel(wrapped).model is model


def test_a_model_compiled_in_place_runs_every_method_eagerly_and_stays_compiled():
    """model.compile() routes each call through dynamo, which cannot trace the hooks (they read
    tensor sizes); every analysis runs the plain forward while it holds the model."""
    model, x = _vit(), _batch()
    expected = {name: vk.methods.METHODS[name](model, x, target=1).maps for name in _SOME_METHODS}
    patterns = vk.attention(model, x).patterns
    model.compile(backend="eager")
    compiled_call = model._compiled_call_impl
    torch.testing.assert_close(vk.attention(model, x).patterns, patterns)
    for name, maps in expected.items():
        torch.testing.assert_close(vk.methods.METHODS[name](model, x, target=1).maps, maps)
    assert model._compiled_call_impl is compiled_call  # still compiled for the user's calls


_SOME_METHODS = ("gradcam", "saliency", "occlusion", "attnlrp", "legrad", "rollout")


def test_two_threads_never_mix_results():
    model = _vit()
    inputs = [_batch(1) * (i + 1) for i in range(2)]
    expected = [vk.attention(model, x).patterns for x in inputs]
    expected_cam = [vk.gradcam(model, x).maps for x in inputs]
    before = _state(model)
    failures: list = []

    def work(i: int) -> None:
        for _ in range(15):
            if not torch.equal(vk.attention(model, inputs[i]).patterns, expected[i]):
                failures.append(("attention", i))
            if not torch.equal(vk.gradcam(model, inputs[i]).maps, expected_cam[i]):
                failures.append(("gradcam", i))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert _state(model) == before


def test_an_analysis_inside_the_models_own_forward_is_refused():
    model, x = _vit(), _batch()
    hm = vk.HookedModel(model)
    before = _state(model)

    def nested(act, *, name):
        vk.attention(model, x)

    with pytest.raises(RuntimeError, match="from inside its own forward"):
        with hm.hooks(fwd={"blocks.0.hook_resid_pre": nested}):
            hm(x)
    assert _state(model) == before
    with hm.hooks(fwd={"blocks.0.attn.hook_pattern": lambda a, name: None}):
        vk.attention(hm, x)  # an analysis inside a hooks context (not a forward) is fine


def _hand_gradcam(model: nn.Module, x: torch.Tensor, target: int) -> tuple:
    """Grad-CAM at the last block's bn2 of a timm ResNet, computed without hooks or in-place
    ops: the block and the head written out (timm BasicBlock: bn2, += shortcut, ReLU)."""
    block = model.layer4[-1]
    with torch.no_grad():
        stem = model.forward_features(x)  # only to check the written-out path below
        h = model.maxpool(model.act1(model.bn1(model.conv1(x))))
        h = model.layer3(model.layer2(model.layer1(h)))
        block_input = model.layer4[0](h)
    a = block.bn2(block.conv2(F.relu(block.bn1(block.conv1(block_input))))).requires_grad_(True)
    out = F.relu(a + block_input)
    torch.testing.assert_close(out, stem)
    score = model.forward_head(out)[:, target].sum()
    (grad,) = torch.autograd.grad(score, a)
    cam = (grad.mean((2, 3), keepdim=True) * a).sum(1).clamp_min(0)
    return cam.detach(), grad


def test_gradients_of_tensors_later_changed_in_place():
    """bn2's output is rewritten by ``x += shortcut; relu_()``; the gradient and Grad-CAM are
    those of the value bn2 gave."""
    torch.manual_seed(0)
    model = vk.create_model("resnet18", num_classes=5).eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    layer = "layer4.1.bn2.hook_out"
    cam, grad = _hand_gradcam(model, x, target=3)
    torch.testing.assert_close(vk.gradcam(model, x, target=3, layer=layer).maps, cam)
    _, cache = vk.HookedModel(model).run_with_cache(x, names=layer, grads=True, target=3)
    torch.testing.assert_close(cache[f"{layer}_grad"], grad)


def test_target_without_grads_is_refused():
    with pytest.raises(ValueError, match="grads=True"):
        vk.HookedModel(_vit()).run_with_cache(_batch(), names="hook_embed", target=1)


def test_class_attention_and_shipped_models_follow_the_contract():
    model, x = build("cait")
    with pytest.raises(ValueError, match="NaN"):
        vk.class_attention(model, x * float("nan"))
    assert vk.class_attention(model.train(), x).maps.isfinite().all()
    assert model.training


class _DictOutput(nn.Module):
    """A model whose forward returns a dict (as some detection or HF-style wrappers do)."""

    def __init__(self, inner: nn.Module, key: str = "logits") -> None:
        super().__init__()
        self.inner, self.key = inner, key

    def forward(self, x: torch.Tensor) -> dict:
        return {self.key: self.inner(x)}


def test_a_model_returning_a_dict_gives_its_logits_or_needs_a_callable_target():
    """A dict's (or a transformers ModelOutput's) "logits" serve class targets; any other
    structured output needs a callable target."""
    torch.manual_seed(0)
    inner, x = vk.create_model("resnet18", num_classes=5).eval(), _batch()
    expected = vk.gradcam(inner, x, layer="layer4.hook_out", target=1)
    cam = vk.gradcam(_DictOutput(inner), x, layer="inner.layer4.hook_out", target=1)
    torch.testing.assert_close(cam.maps, expected.maps)
    other = _DictOutput(inner, key="scores")
    with pytest.raises(ValueError, match="returned dict .*Choose what to explain with target="):
        vk.gradcam(other, x, layer="inner.layer4.hook_out")
    cam = vk.gradcam(other, x, layer="inner.layer4.hook_out", target=lambda o: o["scores"][:, 1])
    torch.testing.assert_close(cam.maps, expected.maps)


def test_threads_restore_training_flags_they_did_not_set():
    """One thread's analysis (eval inside) and another's run_with_cache on a train-mode model:
    each snapshots the flags only once it holds the model, so train mode survives."""
    model = vk.create_model("test_vit", num_classes=5, img_size=32)  # train mode
    hm, x = vk.HookedModel(model), _batch()

    def analyses() -> None:
        for _ in range(10):
            vk.gradcam(model, x)

    def captures() -> None:
        for _ in range(10):
            hm.run_with_cache(x, names="blocks.0.hook_resid_pre")

    threads = [threading.Thread(target=f) for f in (analyses, captures)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(m.training for m in model.modules())


def test_images_that_overflow_the_model_dtype_are_refused():
    hm = vk.HookedModel(_vit())
    with pytest.raises(ValueError, match="overflow the model's torch.float32"):
        hm(torch.full((1, 3, 32, 32), 1e39, dtype=torch.float64))
    with pytest.raises(ValueError, match="meta tensors"):
        hm(torch.empty(1, 3, 32, 32, device="meta"))


def test_gradients_and_inference_mode():
    model, x = _vit(), _batch()
    expected = vk.gradcam(model, x).maps
    with torch.inference_mode():
        frozen = x.clone()
        with pytest.raises(RuntimeError, match="outside it"):
            vk.gradcam(model, x)
    torch.testing.assert_close(vk.gradcam(model, frozen).maps, expected)  # an inference tensor


def test_constant_saliency_maps_are_not_scored():
    masks = torch.zeros(2, 32, 32, dtype=torch.bool)
    masks[:, 4:9, 4:9] = True
    maps = torch.rand(2, 4, 4)
    maps[1] = 0.0
    with pytest.raises(ValueError, match=r"samples \[1\] are constant"):
        vk.metrics.pointing_game(maps, masks)


def test_cka_refuses_batches_of_different_image_sizes():
    model = vk.create_model("test_vit", img_size=32, dynamic_img_size=True).eval()
    data = [torch.randn(4, 3, 32, 32), torch.randn(4, 3, 48, 48)]
    with pytest.raises(ValueError, match=r"\(3, 48, 48\) after batches of \(3, 32, 32\)"):
        vk.cka_matrix(model, data, progress=False)


@pytest.mark.parametrize(
    "make, error, phrase",
    [
        (lambda: vk.papers.cait.LayerScaleExplorer(_batch(), depth=2, eps=(1e-3,)), ValueError,
         "at least 2 values"),
        (lambda: vk.papers.cait.LayerScaleExplorer(_batch(), depth=2, eps=(1e-3, -1.0)), ValueError,
         r"eps must be a number in \(0"),
        (lambda: vk.widgets.HistoryExplorer("card.json"), TypeError, "history must be"),
        (lambda: vk.widgets.AttentionExplorer(_vit(), _batch(), mean=[0.5, 0.5], std=[1, 1, 1]),
         ValueError, "one value per channel"),
        (lambda: vk.widgets.AttentionExplorer(_vit(), _batch()[:0]), ValueError, "empty"),
    ],
)  # fmt: skip
def test_explorers_check_their_inputs(make, error, phrase):
    with pytest.raises(error, match=phrase):
        make()


@pytest.mark.parametrize("size", [32, (-16, 16), (32.0, 32), (32, 32, 3)])
def test_token_layout_refuses_sizes_that_are_not_two_positive_ints(size):
    with pytest.raises(ValueError, match=r"image_size must be \(H, W\)"):
        vk.token_layout(_vit(), size)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_one_pass_finiteness_check_finds_every_non_finite_value(dtype, bad):
    """check_values_finite's fast path (min and max in one pass) against isfinite, at the first
    and last element and in the middle, for a scalar too."""
    from vizkit.hooks.inputs import check_values_finite

    x = torch.randn(3, 2, 5, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    check_values_finite("images", x)
    for index in (0, x.numel() // 2, x.numel() - 1):
        broken = x.clone()
        broken.view(-1)[index] = bad
        sample = index // (2 * 5 * 5)
        with pytest.raises(ValueError, match=rf"samples \[{sample}\]"):
            check_values_finite("images", broken)
    with pytest.raises(ValueError, match="non-finite"):
        check_values_finite("a scalar", torch.tensor(bad, dtype=dtype))
