"""Shared fixtures: tiny timm models covering every adapter and token layout, seeded inputs."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import vizkit as vk

# name -> (timm name, kwargs, input size). Each varies the prefix-token setup or architecture.
MODELS = {
    "vit": ("test_vit", {}, 64),  # class token, dynamic_img_size (NHWC patch embed)
    "vit_reg_avg": ("test_vit2", {}, 64),  # no class token, 1 register token, avg pool, LayerScale
    "vit_map": ("test_vit3", {"img_size": 64}, 64),  # register token, attention-pool head
    "deit_distilled": (
        "deit_tiny_distilled_patch16_224",
        {"img_size": 64, "depth": 2, "num_classes": 10},
        64,
    ),  # 2 prefix tokens (class + distillation)
    "cait": ("cait_xxs24_224", {"img_size": 64, "depth": 2, "num_classes": 10}, 64),
    "resnet": ("resnet18", {"num_classes": 10}, 64),  # generic adapter
}
VIT_FAMILY = ["vit", "vit_reg_avg", "vit_map", "deit_distilled"]
ATTENTION_MODELS = [*VIT_FAMILY, "cait"]


def build(key: str) -> tuple[nn.Module, torch.Tensor]:
    """A seeded model in eval mode and a seeded batch of 2 images for it."""
    name, kwargs, size = MODELS[key]
    torch.manual_seed(0)
    model = vk.create_model(name, **kwargs).eval()
    with (
        torch.no_grad()
    ):  # LayerScale starts at 1e-5: branches that small hide errors below tolerances
        for param_name, param in model.named_parameters():
            if param_name.endswith(("gamma", "gamma_1", "gamma_2")):
                param.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    return model, x


def pass_budget(model: nn.Module, x: torch.Tensor, images: int, gradients: bool) -> int:
    """The ``max_bytes`` that holds ``images`` images per pass of a multi-copy method."""
    from vizkit.hooks.passes import one_image_bytes

    return images * one_image_bytes(model, x, gradients)


@pytest.fixture(params=list(MODELS))
def any_model(request):
    return (request.param, *build(request.param))


@pytest.fixture(params=ATTENTION_MODELS)
def attention_model(request):
    return (request.param, *build(request.param))


@pytest.fixture(params=VIT_FAMILY)
def vit_model(request):
    return (request.param, *build(request.param))


@pytest.fixture
def cait():
    return build("cait")


def hooks_on(model: nn.Module) -> list[str]:
    """Paths of modules that carry any forward, pre-forward or backward hook."""
    return [
        path
        for path, m in model.named_modules()
        if m._forward_hooks
        or m._forward_pre_hooks
        or m._backward_hooks
        or m._backward_pre_hooks
        or getattr(m, "_forward_hooks_with_kwargs", None)
    ]


def model_state(model: nn.Module) -> dict:
    """Everything a hooked run must leave as it found it."""
    return {
        "hooks": hooks_on(model),
        "fused": {p: m.fused_attn for p, m in model.named_modules() if hasattr(m, "fused_attn")},
        "training": {p: m.training for p, m in model.named_modules()},
        "grads": {p: w.grad for p, w in model.named_parameters() if w.grad is not None},
    }


def full_state(model: nn.Module) -> dict:
    """`model_state`, and the weights' values and requires_grad flags."""
    return {**model_state(model), "weights": {k: v.clone() for k, v in model.state_dict().items()},
            "requires_grad": [p.requires_grad for p in model.parameters()]}  # fmt: skip


def assert_full_state(model: nn.Module, before: dict) -> None:
    """The model's `full_state` is ``before``."""
    after = full_state(model)
    weights = after.pop("weights")
    assert after == {k: v for k, v in before.items() if k != "weights"}
    assert weights.keys() == before["weights"].keys()
    assert all(torch.equal(weights[k], before["weights"][k]) for k in weights)


def embedded_tokens(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, N, C) the stream entering a timm ViT's first block on x."""
    seen = {}
    handle = model.blocks[0].register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return seen["x"]


@pytest.fixture(scope="module")
def shapes_sae(tmp_path_factory):
    """The shipped Shapes ViT and a small autoencoder on its block 2 output."""
    model, _ = vk.zoo.load("vit_tiny_shapes")
    x = vk.datasets.load_sample()[0][:32]
    store = vk.cache_activations(model, x, tmp_path_factory.mktemp("store") / "s", layers=[-2],
                                 tokens="all", progress=False)  # fmt: skip
    sae = vk.train_sae(store, expansion=2, k=8, tokens=5 * len(store), batch_size=256,
                       progress=False)  # fmt: skip
    return model, sae


def patch_mean_vit(size: int, patch: int, means: int, zeros: int = 0) -> nn.Module:
    """A one-block timm ViT on size x size images whose patch embedding's channel c < ``means``
    is the mean of image channel c over the patch, the next ``zeros`` channels 0 everywhere,
    the others random; no position embedding (planted units)."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=size, patch_size=patch, depth=1,
                              embed_dim=16, num_heads=2, num_classes=3)  # fmt: skip
    with torch.no_grad():
        model.pos_embed.zero_()
        proj = model.patch_embed.proj
        proj.weight[: means + zeros] = 0
        proj.bias[: means + zeros] = 0
        for channel in range(means):
            proj.weight[channel, channel] = 1 / patch**2
    return model.eval()


def pytest_configure(config):
    """Under pytest-xdist (`make unit`: one worker per core) each worker computes with its share
    of the cores: torch's default, a thread per core in every worker, oversubscribes them."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        affinity = getattr(os, "sched_getaffinity", None)  # the cores nproc counts (Linux)
        cores = len(affinity(0)) if affinity else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // int(workers)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:  # the marker, not the keyword: a parameter id "gpu" is no GPU test
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def torchvision_vit(layers: int = 2) -> nn.Module:
    """A seeded torchvision ViT (32 px, patches of 8, width 32, 5 classes) in eval mode, its
    head drawn (torchvision starts it at zero, so no gradient would flow)."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=layers, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=5,
    ).eval()  # fmt: skip
    torch.nn.init.normal_(model.heads.head.weight)
    return model
