"""SoT (Xie et al. 2022): svPN and its approximation against the paper's equations (Eqs. 4-8),
MGCrP, the head's fusions, the models and the analyses."""

from __future__ import annotations

import math

import pytest
import timm
import torch

import vizkit as vk
from vizkit.models import param_count
from vizkit.papers.sot import MGCrP, SoTHead, isqrt, power_iteration, svpn, svpn_approx
from vizkit.papers.sot import analysis as sot
from vizkit.papers.sot.sot_vit import CONFIGS, PAPER_COUNTS, with_sot_head

torch.set_default_dtype(torch.float32)


def _spread_matrix(values, m, n, seed=0):
    """U diag(values) V^T with random orthonormal U (m x k), V (n x k), float64."""
    g = torch.Generator().manual_seed(seed)
    k = len(values)
    u = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))[0]
    return u @ torch.diag(torch.tensor(values, dtype=torch.float64)) @ v.T


def _gaussian(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------- exact svPN (eq. 5)


@pytest.mark.parametrize("shape", [(5, 5), (7, 4), (4, 7)])
def test_svpn_alpha_one_is_identity(shape):
    q = _gaussian(*shape)
    assert torch.allclose(svpn(q, 1.0), q, atol=1e-12)


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("shape", [(6, 6), (8, 5), (5, 8)])
def test_svpn_gram_is_power_of_gram(alpha, shape):
    """svPN(Q) svPN(Q)^T = (Q Q^T)^alpha, the right side from an eigendecomposition."""
    q = _gaussian(*shape, seed=1)
    out = svpn(q, alpha)
    evals, evecs = torch.linalg.eigh(q @ q.T)
    evals = torch.where(evals > 1e-10, evals, 0.0)  # the rank is min(m, n); round-off to 0
    power = evecs @ torch.diag(evals.pow(alpha)) @ evecs.T
    assert torch.allclose(out @ out.T, power, atol=1e-10)


def test_svpn_properties():
    """Homogeneity, odd symmetry, orthogonal equivariance, transpose, the polar limit and the
    symmetric PSD case (svPN = matrix power, i.e. MPN)."""
    q = _gaussian(6, 6, seed=2)
    a, b = (torch.linalg.qr(_gaussian(6, 6, seed=s))[0] for s in (3, 4))
    assert torch.allclose(svpn(3.0 * q, 0.5), math.sqrt(3.0) * svpn(q, 0.5), atol=1e-12)
    assert torch.allclose(svpn(-q, 0.5), -svpn(q, 0.5), atol=1e-12)
    assert torch.allclose(svpn(a @ q @ b.T, 0.5), a @ svpn(q, 0.5) @ b.T, atol=1e-12)
    assert torch.allclose(svpn(q.T, 0.5), svpn(q, 0.5).T, atol=1e-12)
    polar = svpn(q, 0.0)
    assert torch.allclose(polar @ polar.T, torch.eye(6, dtype=torch.float64), atol=1e-10)
    spd = q @ q.T
    evals, evecs = torch.linalg.eigh(spd)
    assert torch.allclose(svpn(spd, 0.5), evecs @ torch.diag(evals.sqrt()) @ evecs.T, atol=1e-10)


@pytest.mark.parametrize("shape", [(5, 5), (7, 4), (4, 7), (2, 3, 6, 6)])
def test_svpn_backward_matches_finite_differences(shape):
    """gradcheck compares the analytic backward with central finite differences (float64)."""
    q = _gaussian(*shape, seed=5).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: svpn(t, 0.5), (q,), eps=1e-6, atol=1e-5)


def _corollary1(q, g, alpha, wide_term):
    """The paper's Corollary 1 (Supp. C) for d<G, svPN(Q)>/dQ, plus optionally the term it
    misses for m < n."""
    u, lam, vh = torch.linalg.svd(q, full_matrices=False)
    v, lam_d = vh.T, torch.diag(lam)
    inv, pw = torch.diag(1 / lam), torch.diag(lam.pow(alpha))
    d_u, d_v = g @ v @ pw, g.T @ u @ pw
    d_lam = alpha * torch.diag(lam.pow(alpha - 1)) @ torch.diag(torch.diag(u.T @ g @ v))
    diff = lam[:, None] ** 2 - lam[None] ** 2
    k = torch.where(diff == 0, torch.zeros_like(diff), 1 / torch.where(diff == 0, 1, diff))
    inner = k.T * (v.T @ (d_v - v @ inv @ d_u.T @ u @ lam_d))
    grad = d_u @ inv @ v.T + u @ torch.diag(torch.diag(d_lam - u.T @ d_u @ inv)) @ v.T
    grad = grad + 2 * u @ lam_d @ ((inner + inner.T) / 2) @ v.T
    if wide_term:
        grad = grad + u @ inv @ d_v.T @ (torch.eye(q.shape[1], dtype=q.dtype) - v @ v.T)
    return grad


@pytest.mark.parametrize("shape", [(5, 5), (7, 4), (4, 7)])
def test_backward_against_the_papers_corollary(shape):
    """Our backward equals Corollary 1 for square and tall Q; for wide Q only with the term the
    paper's formula misses."""
    q, g = _gaussian(*shape, seed=6), _gaussian(*shape, seed=7)
    leaf = q.clone().requires_grad_()
    (ours,) = torch.autograd.grad((svpn(leaf, 0.5) * g).sum(), leaf)
    fixed = _corollary1(q, g, 0.5, wide_term=True)
    assert torch.allclose(ours, fixed, atol=1e-9)
    paper = _corollary1(q, g, 0.5, wide_term=False)
    if shape[0] < shape[1]:
        assert (ours - paper).abs().max() > 1e-2
    else:
        assert torch.allclose(ours, paper, atol=1e-9)


def test_svpn_backward_finite_at_repeated_singular_values():
    q = _spread_matrix([2.0, 1.0, 1.0, 0.5], 4, 4).requires_grad_()
    (grad,) = torch.autograd.grad(svpn(q, 0.5).pow(2).sum(), q)
    assert torch.isfinite(grad).all()


# ---------------------------------------------------------------- the fast version (eqs. 6-8)


def test_one_iteration_is_q_over_sqrt_lambda_hat():
    """(#sv, #iter) = (1, 1), alpha 0.5: Q / sqrt(lambda_1 estimate), the estimate by hand."""
    q, v0 = _gaussian(3, 6, 6, seed=8), _gaussian(6, seed=9)
    u = q @ v0 / (q @ v0).norm(dim=-1, keepdim=True)
    lam = (q.mT @ u[..., None])[..., 0].norm(dim=-1)
    out, est = svpn_approx(q, v0, alpha=0.5)
    assert torch.allclose(est[..., 0], lam, atol=1e-12)
    assert torch.allclose(out, q / (lam.sqrt() + 1e-5)[:, None, None], atol=1e-12)


@pytest.mark.parametrize("num_sv,num_iter", [(1, 1), (2, 1), (3, 2)])
def test_approx_alpha_one_returns_q(num_sv, num_iter):
    q = _gaussian(5, 5, seed=10)
    out, _ = svpn_approx(q, _gaussian(num_sv, 5, seed=11), 1.0, num_sv, num_iter, eps=0.0)
    assert torch.allclose(out, q, atol=1e-10)


def test_approx_converges_to_exact_with_all_values():
    """r = min(m, n) converged triplets give exact svPN (eq. 8 -> eq. 5)."""
    q = _spread_matrix([5.0, 3.0, 2.0, 1.0], 4, 4)
    out, lam = svpn_approx(q, _gaussian(4, 4, seed=12), 0.5, num_sv=4, num_iter=200, eps=0.0)
    assert torch.allclose(lam, torch.tensor([5.0, 3.0, 2.0, 1.0], dtype=torch.float64), atol=1e-9)
    assert torch.allclose(out, svpn(q, 0.5), atol=1e-8)


def test_power_iteration_underestimates_and_improves():
    """lambda_hat <= lambda_1, non-decreasing in #iter, exact from the top singular vector."""
    q = _gaussian(8, 8, seed=13)
    top = torch.linalg.svdvals(q)[0]
    v0 = _gaussian(8, seed=14)
    estimates = [power_iteration(q, v0, t)[0] for t in (1, 2, 3, 5, 10, 50)]
    assert all(e <= top + 1e-12 for e in estimates)
    assert all(a <= b + 1e-12 for a, b in zip(estimates[:-1], estimates[1:], strict=True))
    v1 = torch.linalg.svd(q)[2][0]
    assert torch.isclose(power_iteration(q, v1, 1)[0], top, atol=1e-12)


def test_reused_start_vector_makes_deflation_degenerate():
    """Eqs. 6-7: after one iteration from v0, the deflated Q' has Q' v0 = 0 exactly, so the
    released reuse of v0 starts the second step from round-off (in float64 its estimate
    collapses); a fresh start vector estimates the second value properly."""
    q, v0 = _gaussian(14, 14, seed=15), _gaussian(14, seed=16)
    lam, u, v = power_iteration(q, v0, 1)
    deflated = q - lam * torch.outer(u, v)
    assert (deflated @ v0).norm() / (q @ v0).norm() < 1e-12
    second = torch.linalg.svdvals(deflated)[0]
    _, reused = svpn_approx(q, v0, 0.5, num_sv=2, num_iter=1)
    _, fresh = svpn_approx(q, torch.stack([v0, _gaussian(14, seed=17)]), 0.5, 2, 1)
    assert reused[1] < 0.01 * second and fresh[1] > 0.3 * second


def test_mgcrp_code_faithful_reuses_one_start_vector():
    pool = _mgcrp(num_sv=2, code_faithful=True)
    fresh = _mgcrp(num_sv=2)
    assert pool.v0.shape == (1, 4) and fresh.v0.shape == (2, 4)
    q = pool.covariance(_gaussian(2, 10, 16, seed=30))
    out, lam = pool.normalize(q)
    expected, expected_lam = svpn_approx(q, pool.v0[0], 0.5, num_sv=2, num_iter=1)
    assert torch.equal(out, expected) and torch.equal(lam, expected_lam)


def test_proposition_1_bound():
    """u^T Q v <= lambda_1 for unit u, v; attained by the top singular pair (Prop. 1)."""
    q = _gaussian(6, 5, seed=18)
    u = torch.nn.functional.normalize(_gaussian(2000, 6, seed=19), dim=1)
    v = torch.nn.functional.normalize(_gaussian(2000, 5, seed=20), dim=1)
    values = ((u @ q) * v).sum(1)
    uu, s, vh = torch.linalg.svd(q)
    assert values.max() <= s[0] and torch.isclose(uu[:, 0] @ q @ vh[0], s[0])


def test_isqrt_converges_to_the_square_root():
    x = _gaussian(50, 6, seed=21)
    p = x.T @ x / 50 + 0.5 * torch.eye(6, dtype=torch.float64)
    evals, evecs = torch.linalg.eigh(p)
    root = evecs @ torch.diag(evals.sqrt()) @ evecs.T
    errors = [(isqrt(p, t) - root).abs().max() for t in (1, 3, 5, 10)]
    assert all(a > b for a, b in zip(errors[:-1], errors[1:], strict=True))
    assert torch.allclose(isqrt(p, 30), root, atol=1e-8)


# ---------------------------------------------------------------- MGCrP (eq. 3)


def _mgcrp(**kwargs):
    torch.manual_seed(0)
    return MGCrP(16, num_heads=3, m=4, **kwargs).double()


def test_mgcrp_covariance_is_eq_3():
    """Q_i = (1/q) W_i Z^T Z R_i^T with W_i, R_i the row slices of the joint projection."""
    pool = _mgcrp()
    z = _gaussian(2, 10, 16, seed=22)
    w = pool.proj.weight
    for i in range(3):
        w_i, r_i = w[4 * i : 4 * i + 4], w[12 + 4 * i : 12 + 4 * i + 4]
        expected = w_i @ z.mT @ z @ r_i.T / 10
        assert torch.allclose(pool.covariance(z)[:, i], expected, atol=1e-12)


def test_mgcrp_shapes_and_sizes():
    z = _gaussian(2, 10, 16, seed=23)
    assert _mgcrp()(z).shape == (2, 3 * 4 * 4)
    assert _mgcrp()(z[:, :3]).shape == (2, 48)  # any number of tokens, even fewer than m
    wide = MGCrP(16, num_heads=2, m=3, n=5).double()
    assert wide(z).shape == (2, 30) and wide.covariance(z).shape == (2, 2, 3, 5)
    # Table 4(a)/(b): representation sizes h m n
    sizes = [MGCrP(8, h, m).out_dim for h, m in [(1, 32), (2, 24), (4, 16), (6, 14), (8, 12)]]
    assert sizes == [1024, 1152, 1024, 1176, 1152]
    assert [MGCrP(8, 6, m).out_dim for m in (9, 14, 18, 24, 32)] == [486, 1176, 1944, 3456, 6144]


@pytest.mark.parametrize("norm", ["approx", "exact", "none"])
@pytest.mark.parametrize("center", [None, "scalar", "channel"])
def test_mgcrp_is_invariant_to_word_token_order(norm, center):
    pool = _mgcrp(norm=norm, center=center)
    z = _gaussian(2, 10, 16, seed=24)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(pool(z), pool(z[:, perm]), atol=1e-10)
    assert torch.allclose(pool(z), pool(torch.cat([z, z], dim=1)), atol=1e-10)  # q -> 2q


def test_mgcrp_centering_options():
    pool = _mgcrp(center="scalar")
    z = _gaussian(1, 10, 16, seed=25)
    x = z @ pool.proj.weight[:4].T  # head 0's X (q, m)
    expected = x - x.mean()  # one scalar per sample and head, as released
    assert torch.allclose(pool.projections(z)[0][0, 0], expected[0], atol=1e-12)
    channel = _mgcrp(center="channel")
    assert torch.allclose(channel.projections(z)[0].mean(dim=2), torch.zeros(1, 3, 4,
                          dtype=torch.float64), atol=1e-12)  # fmt: skip


def test_gcrp_with_equal_projections_is_gcp_with_mpn():
    """W = R, alpha 1/2, no centring: GCrP = MPN of the projected second moment (Table 2)."""
    pool = _mgcrp(norm="exact")
    with torch.no_grad():
        pool.proj.weight[12:] = pool.proj.weight[:12]
    z = _gaussian(1, 20, 16, seed=26)
    x = z[0] @ pool.proj.weight[:4].T
    evals, evecs = torch.linalg.eigh(x.T @ x / 20)
    mpn = evecs @ torch.diag(evals.clamp_min(0).sqrt()) @ evecs.T
    assert torch.allclose(pool(z)[0, :16].view(4, 4), mpn, atol=1e-9)


def test_mgcrp_hooks(tiny_sot):
    hm = vk.HookedModel(tiny_sot)
    x = torch.randn(3, 3, 32, 32)
    names = ["head.pool.hook_cov", "head.pool.hook_sv", "head.pool.hook_sv_normalized",
             "head.hook_classt_logits", "head.hook_wordt_logits"]  # fmt: skip
    logits, cache = hm.run_with_cache(x, names=names)
    cov, sv = cache["head.pool.hook_cov"], cache["head.pool.hook_sv"]
    assert cov.shape == (3, 6, 6, 6) and sv.shape == (3, 6, 6)
    assert torch.allclose(sv, torch.linalg.svdvals(cov), atol=1e-5)
    _, lam = tiny_sot.head.pool.normalize(cov)
    scaled = sv / (lam.sqrt() + 1e-5)
    assert torch.allclose(cache["head.pool.hook_sv_normalized"], scaled, atol=1e-5)
    fused = cache["head.hook_classt_logits"] + cache["head.hook_wordt_logits"]
    assert torch.allclose(logits, fused, atol=1e-6)


# ---------------------------------------------------------------- the head (eq. 1)


@pytest.fixture
def tiny_sot():
    torch.manual_seed(0)
    return timm.create_model("vizkit_sot_micro").eval()


def _tokens(seed=27, batch=4, n=17, dim=16):
    return torch.randn(batch, n, dim, generator=torch.Generator().manual_seed(seed))


def _head(fusion, **kwargs):
    torch.manual_seed(1)
    return SoTHead(16, 5, fusion, num_heads=2, m=3, **kwargs).eval()


def test_concat_and_sum_are_the_same_function_class():
    """Any concat head is a sum head with the FC split (and the converse): equal logits."""
    concat, summed = _head("concat"), _head("sum")
    summed.pool.load_state_dict(concat.pool.state_dict())
    w_cls, w_word = concat.fc.weight.split([16, concat.pool.out_dim], dim=1)
    with torch.no_grad():
        summed.fc_cls.weight.copy_(w_cls)
        summed.fc_word.weight.copy_(w_word)
        summed.fc_cls.bias.copy_(0.3 * concat.fc.bias)
        summed.fc_word.bias.copy_(0.7 * concat.fc.bias)
    t = _tokens()
    assert torch.allclose(concat(t), summed(t), atol=1e-6)
    with torch.no_grad():  # and back: a sum head written as one concatenated FC
        summed.fc_word.weight.mul_(-2.0)
        concat.fc.weight.copy_(torch.cat([summed.fc_cls.weight, summed.fc_word.weight], 1))
        concat.fc.bias.copy_(summed.fc_cls.bias + summed.fc_word.bias)
    assert torch.allclose(concat(t), summed(t), atol=1e-6)


def test_fusions_compute_eq_1():
    t = _tokens()
    z0, words = t[:, 0], t[:, 1:]
    head = _head("sum")
    assert torch.allclose(head(t), head.fc_cls(z0) + head.fc_word(head.pool(words)), atol=1e-6)
    head = _head("aggr_all")
    assert torch.allclose(head(t), head.fc_word(head.pool(t)), atol=1e-6)
    head = _head("classt")
    assert head.pool is None and torch.allclose(head(t), head.fc_cls(z0))
    head = _head("wordt")
    assert torch.allclose(head(t), head.fc_word(head.pool(words)), atol=1e-6)
    late = _head("late")
    probs = late(t).exp() * 2  # the paper's rule: softmax + softmax (sums to 2)
    expected = late.fc_cls(z0).softmax(-1) + late.fc_word(late.pool(words)).softmax(-1)
    assert torch.allclose(probs, expected, atol=1e-5)
    assert torch.allclose(probs.sum(-1), torch.full((4,), 2.0), atol=1e-5)
    code = _head("late", late="code")
    code.load_state_dict(late.state_dict())
    assert torch.allclose(code(t), late.fc_cls(z0) + late.fc_word(late.pool(words)), atol=1e-6)


def test_late_rules_can_disagree():
    """Adding probabilities (paper) and adding logits (released eval) pick different classes."""
    cls = torch.tensor([[3.0, 0, 0, 0, 0]])
    word = torch.tensor([[0.0, 2.5, -5, -5, -5]])
    assert (cls + word).argmax() == 0
    assert (cls.softmax(-1) + word.softmax(-1)).argmax() == 1


def test_head_parameter_counts():
    p, c, h, m = 16, 5, 2, 3
    proj, v0, pooled = p * h * 2 * m, m, h * m * m
    counts = {f: sum(x.numel() for x in _head(f).parameters()) for f in
              ("classt", "wordt", "sum", "concat", "aggr_all", "late")}  # fmt: skip
    assert counts["classt"] == p * c + c
    assert counts["wordt"] == counts["aggr_all"] == proj + v0 + pooled * c + c
    assert counts["sum"] == counts["late"] == counts["wordt"] + p * c + c
    assert counts["concat"] == proj + v0 + (p + pooled) * c + c
    gcp = SoTHead(16, 5, "wordt", "gcp", num_heads=2, m=3)  # reduced int(sqrt(2 h m^2)) = 6
    assert gcp.pool.out_dim == 21
    assert sum(x.numel() for x in gcp.parameters()) == p * 6 + 6 + 21 * c + c


def test_branches_and_token_contributions(tiny_sot):
    x = torch.randn(3, 3, 32, 32)
    with sot.branch(tiny_sot, "classt"):
        classt = tiny_sot(x)
    with sot.branch(tiny_sot, "wordt"):
        wordt = tiny_sot(x)
    assert tiny_sot.head.output == "fused"
    assert torch.allclose(tiny_sot(x), classt + wordt, atol=1e-5)
    result = sot.wordt_token_map(tiny_sot, x, target=2)
    contributions, bias = result.extras["contributions"], result.extras["bias"]
    assert result.maps.shape == (3, 8, 8) and contributions.shape == (3, 64, 10)
    assert torch.allclose(contributions.sum(1) + bias, wordt, atol=1e-5)
    assert torch.allclose(result.maps.flatten(1), contributions[..., 2], atol=1e-7)


@pytest.mark.parametrize("kwargs", [{"norm": "none"}, {"center": "scalar"}, {"fusion": "concat"},
                                    {"norm": "approx", "num_iter": 3}])  # fmt: skip
def test_token_contributions_are_exact(kwargs):
    """Sum over tokens + bias = WordT logit (float64), for every normalization that rescales."""
    fusion = kwargs.pop("fusion", "sum")
    head = _head(fusion, **kwargs).double()
    t = _tokens().double()
    contributions = head.wordt_contributions(t)
    _, word = head.branch_logits(t)
    bias = 0.0 if fusion == "concat" else head.fc_word.bias
    assert torch.allclose(contributions.sum(1) + bias, word, atol=1e-10)


def test_head_errors():
    with pytest.raises(ValueError, match="pre_logits needs one pooled branch"):
        _head("sum")(_tokens(), pre_logits=True)
    with pytest.raises(ValueError, match="fusion must be one of"):
        SoTHead(16, 5, "mean")
    with pytest.raises(ValueError, match="pool must be one of"):
        SoTHead(16, 5, "sum", "max")
    with pytest.raises(ValueError, match="no prefix tokens"):
        SoTHead(16, 5, "sum", num_prefix_tokens=0)
    with pytest.raises(ValueError, match=r"tokens \(B, N, p\)"):
        _head("sum")(torch.randn(4, 16))
    with pytest.raises(ValueError, match="norm must be one of"):
        MGCrP(16, norm="svd")
    with pytest.raises(ValueError, match="center must be one of"):
        MGCrP(16, center="mean")
    with pytest.raises(ValueError, match="alpha must be in"):
        svpn(torch.randn(3, 3), 1.5)
    with pytest.raises(ValueError, match="num_sv must be in"):
        svpn_approx(torch.randn(3, 3), torch.randn(3), num_sv=4)
    with pytest.raises(ValueError, match="v0 must be"):
        svpn_approx(torch.randn(3, 3), torch.randn(2, 3), num_sv=3)
    with pytest.raises(ValueError, match="not a rescaling"):
        _head("sum", norm="exact").wordt_contributions(_tokens())
    with pytest.raises(ValueError, match="has no wordt branch"), _head("aggr_all").branch("wordt"):
        pass
    with pytest.raises(ValueError, match="has no classt branch"), _head("wordt").branch("classt"):
        pass
    with pytest.raises(ValueError, match="not a SoTHead"):
        sot.sot_head(timm.create_model("vizkit_gap_vit_tiny"))


# ---------------------------------------------------------------- models


@pytest.mark.parametrize("name", [f"vizkit_sot_{c}" for c in CONFIGS])
def test_registered_model_contract(name):
    """Forward, backward and the head's hook names for every registered SoT model (the paper
    sizes at 64 px: a 4 x 4 grid)."""
    kwargs = {} if name.startswith(("vizkit_sot_micro", "vizkit_sot_7")) else {"img_size": 64}
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7, **kwargs)
    size = model.patch_embed.img_size
    x = torch.randn(2, 3, *size)
    out = model(x)
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    out.sum().backward()
    assert model.head.pool.proj.weight.grad is not None
    assert model.patch_embed.proj[0].weight.grad is not None if name != "vizkit_sot_micro" else True
    names = vk.HookedModel(model).hook_names()
    for leaf in ("head.hook_tokens", "head.pool.hook_cov", "head.pool.hook_sv",
                 "head.pool.hook_sv_normalized", "head.hook_classt_logits",
                 "head.hook_wordt_logits"):  # fmt: skip
        assert leaf in names


@pytest.mark.parametrize("table,name,kwargs,millions", PAPER_COUNTS)
def test_paper_parameter_counts(table, name, kwargs, millions):
    """Table S-1 within 5% (Supp. A: SoT-Tiny's printed 7.7M leaves out the 0.29M token
    embedding); Table 3(b) within 0.02M, except concat, whose printed counts are ours plus one
    unused 256 x 1000 FC (0.257M; the released classifier builds its ClassT FC in every mode)."""
    count = param_count(name, trainable_only=True, **kwargs) / 1e6
    if table == "Table S-1":
        assert abs(count - millions) / millions < 0.05
    elif kwargs.get("fusion") == "concat":
        assert abs(count + 0.257 - millions) < 0.02
    else:
        assert abs(count - millions) < 0.02


def test_paper_models_use_fixed_sinusoidal_positions():
    with torch.device("meta"):
        model = timm.create_model("vizkit_sot_tiny")
    assert not model.pos_embed.requires_grad
    assert model.patch_embed.grid_size == (14, 14)
    with torch.device("meta"):
        seven = timm.create_model("vizkit_sot_7")
    assert seven.patch_embed.grid_size == (14, 14)  # 112 px, the last stage keeps its size


def test_with_sot_head_on_timm_vits():
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", img_size=64, num_classes=5)
    with_sot_head(vit, m=4)
    assert vit.head.fusion == "sum" and vit(torch.randn(2, 3, 64, 64)).shape == (2, 5)
    regs = timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1,
                                         num_heads=2, reg_tokens=2, num_classes=3)  # fmt: skip
    with_sot_head(regs, m=4, num_heads=2)
    assert regs.head.num_prefix_tokens == 3
    tokens = torch.randn(2, 3 + 16, 32)
    assert torch.allclose(regs.head.word_tokens(tokens), tokens[:, 3:])
    double = with_sot_head(timm.create_model("vizkit_gap_vit_tiny").double(), m=4)
    assert double.head.pool.proj.weight.dtype == torch.float64
    gap = with_sot_head(timm.create_model("vizkit_gap_vit_tiny"), m=4)
    assert gap.head.fusion == "wordt" and gap(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="only fusion 'wordt'"):
        with_sot_head(timm.create_model("vizkit_gap_vit_tiny"), fusion="sum")
    with pytest.raises(TypeError, match="keeps its forward_head"):
        with_sot_head(timm.create_model("deit_tiny_distilled_patch16_224", img_size=32))
    with pytest.raises(TypeError, match="keeps its forward_head"):
        with_sot_head(timm.create_model("resnet18"))


def test_with_sot_head_on_swin():
    """No class token: a WordT head on every position of Swin's final (B, H, W, C) map."""
    torch.manual_seed(0)
    small = {"img_size": 32, "patch_size": 4, "window_size": 4, "embed_dim": 16}
    swin = timm.models.SwinTransformer(**small, depths=(1, 1), num_heads=(1, 2), num_classes=5)
    swin.eval()
    x = torch.randn(2, 3, 32, 32)
    features = swin.forward_features(x)  # (2, 4, 4, 32)
    with_sot_head(swin, m=4, num_heads=2)
    head = swin.head
    assert head.fusion == "wordt" and head.num_prefix_tokens == 0
    expected = head.fc_word(head.pool(features.flatten(1, 2)))
    assert torch.allclose(swin(x), expected, atol=1e-6)
    assert swin.forward_head(features, pre_logits=True).shape == (2, 2 * 4 * 4)
    _, cache = vk.HookedModel(swin).run_with_cache(x, names="head.pool.hook_cov")
    assert cache["head.pool.hook_cov"].shape == (2, 2, 4, 4)
    with pytest.raises(ValueError, match="only fusion 'wordt'"):
        with_sot_head(timm.models.SwinTransformer(**small, depths=(1,), num_heads=(1,)), "sum")


def test_head_anatomy_and_branch_gradcam(tiny_sot):
    x = torch.randn(2, 3, 32, 32)
    anatomy = sot.head_anatomy(tiny_sot, x)
    assert anatomy.cov.shape == (2, 6, 6, 6) and anatomy.lambda_hat.shape == (2, 6, 1)
    assert torch.allclose(anatomy.svpn_values(1.0), anatomy.singular_values.clamp_min(1e-5))
    assert torch.allclose(anatomy.approx_values(anatomy.alpha), anatomy.normalized_values,
                          atol=1e-5)  # fmt: skip
    for name in ("classt", "wordt"):
        result = sot.branch_gradcam(tiny_sot, x, name, target=1)
        assert result.maps.shape == (2, 8, 8) and result.options["branch"] == name
        assert (result.maps >= 0).all() and result.maps.sum() > 0
    assert tiny_sot.head.output == "fused"
    classt_only = timm.create_model("vizkit_sot_micro", fusion="classt")
    assert vk.gradcam(classt_only, x, target=1).options["layer"] == ("blocks.3.hook_resid_pre")


def test_branch_predictions_and_fig_s4_panels(tiny_sot):
    data = torch.utils.data.TensorDataset(torch.randn(10, 3, 32, 32), torch.arange(10) % 10)
    preds = sot.branch_predictions(tiny_sot, data, batch_size=4)
    assert preds.logits.shape == preds.classt.shape == preds.wordt.shape == (10, 10)
    assert torch.allclose(preds.logits, preds.classt + preds.wordt, atol=1e-5)
    plain = sot.branch_predictions(timm.create_model("vizkit_gap_vit_tiny"), data)
    assert plain.logits.shape == (10, 10) and plain.classt is None
    with pytest.raises(ValueError, match="No wordt logits"):
        plain.correct("wordt")
    with pytest.raises(ValueError, match="which must be"):
        preds.correct("fused")
    c = torch.tensor([1, 1, 0, 0, 1], dtype=torch.bool)
    w = torch.tensor([1, 0, 1, 0, 0], dtype=torch.bool)
    b = torch.tensor([1, 1, 1, 1, 0], dtype=torch.bool)
    panels = sot.fig_s4_panels(c, w, b)
    assert [panels[k].tolist() for k in ("both", "classt_only", "wordt_only", "neither")] == [
        [0], [1], [2], [3]]  # fmt: skip


# ---------------------------------------------------------------- figures


def test_sot_figures(tiny_sot):
    x = torch.randn(3, 3, 32, 32)
    anatomy = sot.head_anatomy(tiny_sot, x)
    fig = vk.papers.sot.svpn_spectrum_figure(anatomy, image=1, alphas=(0.3, 0.5, 1.0))
    assert len(fig.layout.sliders[0].steps) == 3 and len(fig.data) == 3 * 3 * 6
    assert fig.layout.sliders[0].active == 1  # the model's alpha 0.5
    shown = [t for t in fig.data if t.visible]
    assert len(shown) == 18 and all(t.y is not None for t in shown)
    exact = [t for t in shown if t.name == "head 0: svPN"][0]
    assert torch.allclose(torch.tensor(exact.y), anatomy.svpn_values(0.5)[1, 0], atol=1e-6)
    assert len(vk.papers.sot.cross_covariance_figure(anatomy).data) == 6
    assert [t.name for t in vk.papers.sot.branch_logits_figure(anatomy).data] == ["ClassT", "WordT",
                                                                           "output"]  # fmt: skip
    maps = {"a": sot.branch_gradcam(tiny_sot, x, "wordt"), "b": sot.wordt_token_map(tiny_sot, x)}
    grid = vk.papers.sot.maps_grid(vk.viz.display_images(x), maps, [0, 2])
    assert len(grid.layout.annotations) >= 4
    with pytest.raises(ValueError, match="image must be in"):
        vk.papers.sot.cross_covariance_figure(anatomy, image=3)
    with pytest.raises(ValueError, match="indices is empty"):
        vk.papers.sot.maps_grid(vk.viz.display_images(x), maps, [])
