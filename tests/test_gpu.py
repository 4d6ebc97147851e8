"""CUDA checks (skipped without a GPU): parity under fused CUDA attention, cache placement."""

import json
import warnings

import pytest
import torch
from conftest import build

import vizkit as vk

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
def test_cuda_parity_and_patterns(dtype, tol):
    model, x = build("vit")
    model, x = model.cuda().to(dtype), x.cuda().to(dtype)
    hm = vk.HookedModel(model)
    with torch.no_grad():
        plain = model(x)
        out, cache = hm.run_with_cache(x, names="*attn.hook_pattern")
        _, on_cpu = hm.run_with_cache(x, names="*attn.hook_pattern", device="cpu")
    assert (out.float() - plain.float()).abs().max() < tol
    patterns = cache.stack("attn.hook_pattern")
    assert (
        patterns.device.type == "cuda" and on_cpu["blocks.0.attn.hook_pattern"].device.type == "cpu"
    )
    assert torch.allclose(patterns.float().sum(-1), torch.ones((), device="cuda"), atol=tol)
    assert all(b.attn.fused_attn for b in model.blocks)


def test_analyses_run_on_the_models_device_and_agree_with_cpu():
    model, x = build("deit_distilled")
    on_cpu = {
        "rollout": vk.rollout(model, x).maps,
        "gradcam": vk.gradcam(model, x, target=1).maps,
        "grad_rollout": vk.grad_rollout(model, x, target=1).maps,
        "saliency": vk.saliency(model, x, target=1).maps,
        "class_attention": vk.class_attention(model, x).maps,
    }
    model = model.cuda()  # x stays on the CPU: the analyses move it
    on_gpu = {
        "rollout": vk.rollout(model, x).maps,
        "gradcam": vk.gradcam(model, x, target=1).maps,
        "grad_rollout": vk.grad_rollout(model, x, target=1).maps,
        "saliency": vk.saliency(model, x, target=1).maps,
        "class_attention": vk.class_attention(model, x).maps,
    }
    for name, maps in on_gpu.items():
        assert maps.device.type == "cuda", name
        torch.testing.assert_close(maps.cpu(), on_cpu[name], rtol=1e-3, atol=1e-5)
    assert all(p.requires_grad for p in model.parameters())
    curve = vk.metrics.deletion(model, x, on_gpu["rollout"], steps=4)
    assert curve.auc.device.type == "cuda"


def test_cka_and_residual_ratios_on_cuda_agree_with_cpu():
    model, x = build("cait")
    x = x.repeat(4, 1, 1, 1) + 0.1 * torch.randn(8, *x.shape[1:])  # 8 distinct images
    cpu_cka = vk.cka_matrix(model, x, batch_size=4, progress=False).matrix
    cpu_ratios = vk.residual_ratios(model, x)
    model = model.cuda()
    gpu_cka = vk.cka_matrix(model, x, batch_size=4, progress=False).matrix  # returned on the CPU
    gpu_ratios = vk.residual_ratios(model, x)
    torch.testing.assert_close(gpu_cka, cpu_cka, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gpu_ratios.attn, cpu_ratios.attn, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(gpu_ratios.mlp, cpu_ratios.mlp, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_cka_kernels_on_cuda_equal_the_cpus(dtype):
    # half features are centered and multiplied in float32 on either device
    from vizkit.analysis.cka_kernels import cka_from_hsic, hsic_matrix, kernel

    g = torch.Generator().manual_seed(0)
    features = [(torch.randn(32, 3000, generator=g) * 4 + 7).to(dtype) for _ in range(2)]
    cpu = cka_from_hsic(hsic_matrix([kernel(f) for f in features], True), ["a", "b"])
    gpu = cka_from_hsic(hsic_matrix([kernel(f.cuda()) for f in features], True), ["a", "b"])
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=1e-6)


def test_sot_head_on_cuda_matches_cpu():
    """The SoT model (exact and approximate svPN) on CUDA: same logits and token shares as on the
    CPU; half-precision input to svPN is computed in float32 and returned in its dtype."""
    import timm

    from vizkit.papers.sot import analysis as sot
    from vizkit.papers.sot import svpn

    torch.manual_seed(0)
    x = torch.randn(4, 3, 32, 32)
    for norm in ("approx", "exact"):
        model = timm.create_model("vizkit_sot_micro", norm=norm).eval()
        on_cpu = model(x)
        shares_cpu = sot.wordt_token_map(model, x, target=1).maps if norm == "approx" else None
        model = model.cuda()
        out = model(x.cuda())
        assert (out.cpu() - on_cpu).abs().max() < 1e-4
        out.sum().backward()
        if shares_cpu is not None:
            shares = sot.wordt_token_map(model, x, target=1).maps
            assert (shares.cpu() - shares_cpu).abs().max() < 1e-4
    q = torch.randn(8, 6, 6, device="cuda")
    half = svpn(q.bfloat16(), 0.5)
    assert half.dtype == torch.bfloat16
    assert (half.float() - svpn(q, 0.5)).abs().max() < 5e-2


def test_cka_waits_for_the_gpu_once_per_batch():
    import timm

    torch.manual_seed(0)
    model = timm.create_model("test_vit", depth=12).eval().cuda()
    x = torch.randn(16, 3, 64, 64, device="cuda")
    vk.cka_matrix(model, x, batch_size=4, progress=False)  # warm-up
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            vk.cka_matrix(model, x, batch_size=4, progress=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    # per batch: the images' finiteness check and one read of every layer's flags; at the end,
    # the readout. One sync per layer per batch would be 4 x 12 = 48.
    assert len(syncs) <= 4 * 3 + 6, len(syncs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_beside_the_fused_kernel_matches_the_unfused_maps_on_cuda(dtype):
    model, x = build("vit")
    model, x = model.cuda(), x.cuda()
    hm = vk.HookedModel(model)
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        names = "blocks.*.attn.hook_pattern"
        _, unfused = hm.run_with_cache(x, names=names, pattern_path="unfused")
        _, beside = hm.run_with_cache(x, names=names, pattern_path="beside")
        auto = vk.attention(model, x).patterns
    assert torch.equal(beside["blocks.0.attn.hook_pattern"], unfused["blocks.0.attn.hook_pattern"])
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for name in unfused.keys():
        torch.testing.assert_close(beside[name], unfused[name], atol=tol, rtol=0)
    assert auto.dtype == unfused["blocks.0.attn.hook_pattern"].dtype
    assert all(b.attn.fused_attn for b in model.blocks)


def test_a_recipe_trains_on_cuda_and_its_card_says_so(tmp_path):
    from test_zoo import TINY

    from vizkit.train.recipes import run_recipe, sample_accuracy

    recipe = tmp_path / "tiny_digits_recipe.json"
    # 8 epochs: 1 leaves it at chance (0.111 of 360 test digits on CPU and CUDA); 8 reached
    # 0.367 on CPU and 0.358 on an H100 (2026-11-27)
    recipe.write_text(json.dumps({**TINY, "train": {**TINY["train"], "epochs": 8}}))
    card = run_recipe(recipe, out_dir=tmp_path, progress=False, device="cuda")
    assert card["trained_on"].startswith("cuda (") and 0.25 <= card["test_accuracy"] <= 1
    model, _ = vk.zoo.load(tmp_path / "tiny_digits.safetensors")  # the weights saved from cuda
    assert card["sample_accuracy"] == sample_accuracy(model, "digits")


@pytest.mark.parametrize("method", ["smoothgrad", "integrated_gradients", "scorecam"])
def test_multi_copy_methods_on_cuda_take_the_budget_and_agree_with_cpu(method):
    """On CUDA the default pass holds at least the batch (and 256 MiB, within the free
    memory); a budget of one image gives the same maps, which equal the CPU's where no noise
    is drawn (CUDA's generators draw other numbers than the CPU's from the same seed)."""
    from conftest import pass_budget

    from vizkit.hooks.passes import images_per_pass

    model, x = build("vit")
    options = {"samples": 3} if method == "smoothgrad" else {}
    on_cpu = getattr(vk, method)(model, x, target=1, **options).maps
    model, x = model.cuda(), x.cuda()
    gradients = method != "scorecam"
    assert images_per_pass(model, x, None, gradients, method) >= len(x)
    default = getattr(vk, method)(model, x, target=1, **options).maps
    small = getattr(vk, method)(model, x, target=1, max_bytes=pass_budget(model, x, 1, gradients),
                                **options).maps  # fmt: skip
    torch.testing.assert_close(small, default, rtol=1e-4, atol=1e-5)
    if method != "smoothgrad":
        torch.testing.assert_close(default.cpu(), on_cpu, rtol=1e-3, atol=1e-4)


def test_a_sparse_autoencoder_trains_and_splices_on_cuda(tmp_path):
    """The store is written from a CUDA model, the autoencoder trains on CUDA from its rows
    (read on the CPU, moved per batch), and its scores agree with the same run on the CPU."""
    model, _ = vk.zoo.load("vit_tiny_shapes")
    store = vk.cache_activations(model.cuda(), "shapes", tmp_path / "s", layers=[-2],
                                 progress=False)  # fmt: skip
    settings = dict(expansion=2, k=8, tokens=4 * len(store), batch_size=256, progress=False)
    on_gpu = vk.train_sae(store, device="cuda", **settings)
    on_cpu = vk.train_sae(store, device="cpu", **settings)
    assert on_gpu.W_dec.device.type == "cuda"
    gpu, cpu = (vk.sae.evaluate_sae(s, store, progress=False) for s in (on_gpu, on_cpu))
    assert abs(gpu.fvu - cpu.fvu) < 0.05 and gpu.l0 == pytest.approx(8.0)
    score = vk.sae.spliced_score(model, on_gpu, "shapes", progress=False)
    assert 0 < score.kl < score.kl_bias_only
    vk.sae.ablate(model, on_gpu, vk.datasets.load_sample()[0][:4].cuda(), 0)
