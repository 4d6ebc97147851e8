"""Sparse autoencoders: the TopK and BatchTopK forward and the AuxK loss against Overcomplete
(an independent implementation), the equations of Gao et al. 2024 and Bussmann et al. 2024,
recovery of a planted dictionary, resuming, evaluation, and the spliced-in score (which leaves
the model as it was)."""

from __future__ import annotations

import importlib
import shutil

import numpy as np
import pytest
import timm
import torch
from conftest import model_state
from guide_example import run_first_example
from overcomplete.sae import BatchTopKSAE, TopKSAE
from overcomplete.sae.losses import top_k_auxiliary_loss
from scipy.optimize import minimize

import vizkit as vk
from vizkit.sae import SparseAutoencoder, evaluate_sae, spliced_score
from vizkit.sae.autoencoder import batch_topk
from vizkit.sae.losses import auxk_loss, l1_penalty, matryoshka_loss, normalized_mse
from vizkit.sae.median import geometric_median
from vizkit.sae.order import ShuffledBatches
from vizkit.sae.rows import TensorRows
from vizkit.sae.settings import TrainingSettings
from vizkit.sae.spliced import replaced_tokens, splice_hook
from vizkit.sae.synthetic import planted_rows
from vizkit.sae.training import _Run


def random_sae(kind: str = "topk", k: int | None = 4, width: int = 16, latents: int = 48):
    sae = SparseAutoencoder(width, latents, kind, k, seed=3)
    with torch.no_grad():
        for p in (sae.W_enc, sae.b_enc, sae.b_dec):
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        sae.input_scale.fill_(1.7)
    return sae


class Encoder(torch.nn.Module):
    """Overcomplete's encoder contract, (pre-codes, ReLU(pre-codes)), on vizkit's weights."""

    def __init__(self, sae: SparseAutoencoder) -> None:
        super().__init__()
        self.sae = sae

    def forward(self, x):
        pre = self.sae.pre_activations(x)
        return pre, pre.relu()


def overcomplete_twin(sae: SparseAutoencoder, cls, top_k: int):
    twin = cls(sae.width, sae.latents, top_k=top_k, encoder_module=Encoder(sae))
    twin.dictionary._weights.data.copy_(sae.W_dec.data)  # unit rows: kept by its l2 norm
    return twin.train()


def test_topk_forward_equals_overcomplete():
    sae = random_sae()
    x = torch.randn(64, sae.width, generator=torch.Generator().manual_seed(0))
    pre, z, decoded = overcomplete_twin(sae, TopKSAE, sae.k)(x)
    torch.testing.assert_close(sae.encode(x), z, rtol=0, atol=0)
    # Overcomplete decodes without bias or input scale: x_hat = z D
    torch.testing.assert_close(sae(x) * sae.input_scale - sae.b_dec, decoded)
    assert ((z > 0).sum(-1) == sae.k).all()


def test_batchtopk_training_forward_equals_overcomplete():
    sae = random_sae("batchtopk").train()
    x = torch.randn(32, sae.width, generator=torch.Generator().manual_seed(1))
    _, z, _ = overcomplete_twin(sae, BatchTopKSAE, sae.k * len(x))(x)  # its top_k: per batch
    ours = sae.encode(x)
    torch.testing.assert_close(ours, z, rtol=0, atol=0)
    assert int((ours > 0).sum()) == sae.k * len(x)
    assert (ours > 0).sum(-1).float().std() > 0  # rows keep different counts


def test_auxk_reconstruction_equals_overcomplete():
    """Overcomplete's AuxK reconstructs each row's residual from the top half of the latents
    that row did not keep; with that (B, latents) mask as ``dead`` ours is the same sum."""
    sae = random_sae()
    x = torch.randn(64, sae.width, generator=torch.Generator().manual_seed(2))
    pre, z, decoded = overcomplete_twin(sae, TopKSAE, sae.k)(x)
    target = x * sae.input_scale - sae.b_dec  # what Overcomplete's x_hat = z D reconstructs
    penalty = 0.5
    theirs = top_k_auxiliary_loss(target, decoded, pre, z, sae.W_dec, penalty=penalty)
    their_aux = (theirs - (target - decoded).square().mean()) / penalty  # mean over B x width
    residual = target - decoded
    ours = auxk_loss(pre, z == 0, residual, sae.W_dec, sae.latents // 2)
    spread = (residual - residual.mean(0)).square().sum()
    torch.testing.assert_close(ours * spread, their_aux * residual.numel(), rtol=1e-4, atol=1e-6)


def test_topk_and_batchtopk_follow_the_equations():
    sae = random_sae()
    x = torch.randn(20, sae.width, generator=torch.Generator().manual_seed(4))
    pre = sae.pre_activations(x)
    torch.testing.assert_close(pre, (x * 1.7 - sae.b_dec) @ sae.W_enc + sae.b_enc)
    z = sae.encode(x)
    for row_pre, row_z in zip(pre, z, strict=True):  # Gao et al. Eq. 3: the k largest, ReLU
        kept = row_z.nonzero().flatten()
        assert set(kept.tolist()) <= set(row_pre.topk(sae.k).indices.tolist())
        torch.testing.assert_close(row_z[kept], row_pre[kept].relu())
    torch.testing.assert_close(sae.decode(z), (z @ sae.W_dec + sae.b_dec) / 1.7)
    positive = pre.relu()
    kept = batch_topk(positive, 3)  # Bussmann et al.: the 3 B largest of the batch
    smallest = positive.detach().flatten().topk(60).values[-1]
    assert int((kept > 0).sum()) == 60 and kept[kept > 0].min() >= smallest
    threshold = float(smallest)  # in use: JumpReLU at theta
    batch = random_sae("batchtopk").eval()
    batch.threshold.fill_(threshold)
    pre = batch.pre_activations(x)
    torch.testing.assert_close(batch.encode(x), pre.relu() * (pre > threshold))
    relu = random_sae("relu", None)
    torch.testing.assert_close(relu.encode(x), relu.pre_activations(x).relu())


def test_losses_follow_their_definitions():
    x = torch.randn(50, 8, generator=torch.Generator().manual_seed(5))
    x_hat = x + 0.3 * torch.randn(50, 8, generator=torch.Generator().manual_seed(6))
    fvu = ((x_hat - x) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    torch.testing.assert_close(normalized_mse(x_hat, x), fvu)
    torch.testing.assert_close(normalized_mse(x.mean(0).expand_as(x), x), torch.tensor(1.0))
    W_dec = torch.randn(12, 8)
    z = torch.rand(50, 12)
    torch.testing.assert_close(l1_penalty(z, W_dec), (z * W_dec.norm(dim=1)).sum(1).mean())
    # AuxK: only dead latents, the k_aux largest of ReLU(pre) per row, no decoder bias
    pre = torch.randn(50, 12, generator=torch.Generator().manual_seed(7))
    dead = torch.zeros(12, dtype=torch.bool)
    assert auxk_loss(pre, dead, x, W_dec, 4) == 0
    dead[[1, 5, 7, 9, 11]] = True
    values = pre.relu() * dead
    top = values.topk(3, dim=1)
    z_aux = torch.zeros_like(values).scatter(1, top.indices, top.values)
    torch.testing.assert_close(auxk_loss(pre, dead, x, W_dec, 3), normalized_mse(z_aux @ W_dec, x))


def test_matryoshka_averages_the_prefixes_reconstructions(tmp_path):
    """Bussmann et al. 2025: each prefix of the dictionary reconstructs on its own."""
    x = torch.randn(40, 8, generator=torch.Generator().manual_seed(9))
    z = torch.rand(40, 16)
    W_dec, b_dec = torch.randn(16, 8), torch.randn(8)
    by_hand = sum(((z[:, :p] @ W_dec[:p] + b_dec - x) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
                  for p in (2, 8, 16)) / 3  # fmt: skip
    torch.testing.assert_close(matryoshka_loss(z, W_dec, b_dec, x, [2, 8, 16]), by_hand)
    sae = SparseAutoencoder(8, 32, "matryoshka", 4)
    assert sae.prefixes == [2, 8, 32]
    sae.save(tmp_path)
    assert SparseAutoencoder.load(tmp_path).prefixes == [2, 8, 32]
    with pytest.raises(ValueError, match="the largest 32"):
        SparseAutoencoder(8, 32, "matryoshka", 4, prefixes=[4, 16])
    with pytest.raises(ValueError, match="nested sizes of kind='matryoshka', not 'topk'"):
        SparseAutoencoder(8, 32, "topk", 4, prefixes=[4, 32])


def test_geometric_median_minimizes_the_summed_distance():
    points = torch.randn(200, 5, generator=torch.Generator().manual_seed(8)) ** 3
    median = geometric_median(points).double()

    def total(y):
        return float((points.double() - torch.from_numpy(y)).norm(dim=1).sum())

    best = minimize(total, points.double().mean(0).numpy(), method="Nelder-Mead",
                    options={"xatol": 1e-10, "fatol": 1e-10, "maxiter": 20000})  # fmt: skip
    assert total(median.numpy()) <= best.fun + 1e-6
    assert total(median.numpy()) < total(points.double().mean(0).numpy())


@pytest.mark.parametrize("kind", ["topk", "batchtopk", "relu", "matryoshka"])
def test_planted_dictionary_is_recovered(kind):
    """Every planted direction has a decoder row within cosine 0.9, over two seeds (nine in
    ten for Matryoshka)."""
    for seed in range(2):
        rows, dictionary = planted_rows(seed)
        sae = vk.train_sae(rows, kind=kind, expansion=4, k=3, tokens=8 * len(rows),
                           batch_size=512, seed=seed, progress=False)  # fmt: skip
        cosine = (dictionary @ sae.W_dec.detach().T).max(dim=1).values
        # Matryoshka's small prefixes (4 and 16 latents here) must reconstruct alone, so a
        # few of its latents mix flat planted directions: 61 of 64 on both seeds
        least = 0.9 if kind == "matryoshka" else 1.0
        assert float((cosine > 0.9).float().mean()) >= least, (kind, seed, cosine.min())
        scores = evaluate_sae(sae, rows, progress=False)
        assert scores.fvu < 0.2 and (kind == "relu" or abs(scores.l0 - 3) < 0.5)


def sae_settings(**changed) -> TrainingSettings:
    """Valid `TrainingSettings` with ``changed`` fields."""
    fields = dict(kind="topk", latents=64, k=4, l1=None, prefixes=None, tokens=4096,
                  batch_size=256, lr=1e-3, warmup=0.05, decay=0.2, aux_k=8,
                  aux_coefficient=1 / 32, dead_after=100, b_dec="median", block_bytes=2**20,
                  seed=0, source={})  # fmt: skip
    return TrainingSettings(**{**fields, **changed})


def test_decoder_rows_stay_unit_and_schedule_warms_and_decays():
    rows, _ = planted_rows(0, rows=4096)
    sae = vk.train_sae(rows, expansion=2, k=3, tokens=40 * 256, batch_size=256, progress=False)
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(sae.latents))
    run = sae_settings(tokens=100, batch_size=1, warmup=0.1, decay=0.2)
    factors = [run.learning_rate_factor(s) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == 1.0 and factors[50] == 1.0
    assert factors[80] == 1.0 and factors[99] == pytest.approx(0.05) and factors[90] == 0.5


def test_a_killed_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    rows, _ = planted_rows(1, rows=6000)
    settings = dict(kind="topk", expansion=2, k=3, tokens=30 * 256, batch_size=256,
                    block_bytes=64 * 32 * 4, progress=False)  # fmt: skip
    whole = vk.train_sae(rows, **settings)
    step = _Run.train_step
    calls = {"n": 0}

    def dies_at_step_17(self, batch):
        calls["n"] += 1
        if calls["n"] == 17:
            raise KeyboardInterrupt
        return step(self, batch)

    monkeypatch.setattr(_Run, "train_step", dies_at_step_17)
    with pytest.raises(KeyboardInterrupt):
        vk.train_sae(rows, checkpoint=tmp_path, checkpoint_every=5, **settings)
    monkeypatch.setattr(_Run, "train_step", step)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 15
    resumed = vk.train_sae(rows, checkpoint=tmp_path, checkpoint_every=5, **settings)
    for name, value in whole.state_dict().items():  # the threshold: nan, unused by TopK
        torch.testing.assert_close(value, resumed.state_dict()[name], rtol=0, atol=0,
                                   equal_nan=True)  # fmt: skip
    assert (tmp_path / "sae.json").is_file()
    monkeypatch.setattr(_Run, "train_step", dies_at_step_17)  # a finished run trains no more
    calls["n"] = 16
    again = vk.train_sae(rows, checkpoint=tmp_path, checkpoint_every=5, **settings)
    assert torch.equal(again.W_dec, resumed.W_dec) and calls["n"] == 16
    loaded = SparseAutoencoder.load(tmp_path)
    assert torch.equal(loaded.encode(rows[:10]), resumed.encode(rows[:10]))
    with pytest.raises(ValueError, match=r"another run \(k: 3 -> 4"):
        vk.train_sae(rows, checkpoint=tmp_path, **{**settings, "k": 4})


def test_batches_cover_each_epoch_once_and_restart_anywhere():
    rows = TensorRows(torch.arange(1000.0)[:, None])
    batches = ShuffledBatches(rows, batch_size=64, seed=0, block_bytes=100 * 4)
    assert batches.block_rows == 100 and len(batches) == 15
    stream = batches.from_step(0)
    epoch = torch.cat([next(stream) for _ in range(15)]).flatten()
    assert len(epoch.unique()) == 960  # no row twice; 40 left over
    assert not torch.equal(epoch[:100], torch.arange(100.0))  # shuffled
    again = list(zip(range(20), batches.from_step(0), strict=False))
    later = batches.from_step(7)
    for step in range(7, 20):
        assert torch.equal(next(later), again[step][1])


def test_evaluation_matches_its_definitions():
    rows, _ = planted_rows(2, rows=3000)
    sae = random_sae("topk", 3, width=32, latents=64).eval()
    scores = evaluate_sae(sae, rows, batch_size=700, progress=False)
    with torch.no_grad():
        z, x_hat = sae.encode(rows), sae(rows)
    fvu = ((x_hat - rows) ** 2).sum() / ((rows - rows.mean(0)) ** 2).sum()
    assert scores.fvu == pytest.approx(float(fvu), rel=1e-5)
    assert scores.l0 == pytest.approx(3.0)
    density = (z > 0).float().mean(0)
    torch.testing.assert_close(scores.density, density)
    assert scores.dead == pytest.approx(float((density == 0).float().mean()))
    assert scores.dense == pytest.approx(float((density > 0.1).float().mean()))
    assert "L0=3.0" in repr(scores)


def tiny_vit(num_classes: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                             num_classes=num_classes).eval()  # fmt: skip


@pytest.fixture(scope="module")
def shapes_store(tmp_path_factory):
    model, _ = vk.zoo.load("vit_tiny_shapes")
    folder = tmp_path_factory.mktemp("sae") / "store"
    store = vk.cache_activations(model, "shapes", folder, layers=[-2], progress=False)
    return model, store


def identity_sae(width: int, source: dict) -> SparseAutoencoder:
    """x_hat = ReLU(x) - ReLU(-x) = x exactly."""
    sae = SparseAutoencoder(width, 2 * width, "relu", source=source)
    eye = torch.eye(width)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
    return sae.eval()


def state(model: torch.nn.Module) -> tuple:
    """What no call may change: conftest's `model_state` (hooks, fused flags, modes, ``.grad``),
    each parameter's ``requires_grad``, and (last) every weight."""
    requires = {p: w.requires_grad for p, w in model.named_parameters()}
    return model_state(model), requires, {k: v.clone() for k, v in model.state_dict().items()}


def test_spliced_score_of_an_exact_reconstruction_changes_nothing(shapes_store):
    model, store = shapes_store
    sae = vk.train_sae(store, expansion=2, k=8, tokens=4 * len(store), batch_size=256,
                       progress=False)  # fmt: skip
    exact = identity_sae(store.width, sae.source)
    x = vk.datasets.load_sample()[0][:8]
    before = state(model)
    clean = model(x)
    score = spliced_score(model, exact, "shapes", progress=False)
    assert score.kl == pytest.approx(0, abs=1e-9) and score.agreement == 1.0
    assert score.accuracy_clean == score.accuracy_spliced and score.kl_recovered == 1.0
    after = state(model)
    assert before[:2] == after[:2]
    assert all(torch.equal(v, after[2][k]) for k, v in before[2].items())
    assert torch.equal(model(x), clean)
    trained = spliced_score(model, sae, "shapes", progress=False)
    assert 0 < trained.kl < trained.kl_bias_only and trained.images == 64
    assert "kl_recovered" in repr(trained) and "embedding_cosine" not in repr(trained)


def test_the_bias_only_run_is_the_splice_with_every_latent_off(shapes_store):
    """Issue 70: the bias-only run encodes nothing; its KL is that of `splice_hook` with every
    latent edited to zero (the earlier computation), and the spliced run's is `splice_hook`'s."""
    model, store = shapes_store
    sae = vk.train_sae(store, expansion=2, k=8, tokens=4 * len(store), batch_size=256,
                       progress=False)  # fmt: skip
    x = vk.datasets.load_sample()[0][:8]
    score = spliced_score(model, sae, (x,), batch_size=3, progress=False)
    hm = vk.HookedModel(model)
    positions = replaced_tokens(hm, sae, tuple(x.shape[-2:]))
    with torch.no_grad():
        clean = model(x).double().log_softmax(-1)
        expected = {}
        for what, edit in (("kl", None), ("kl_bias_only", torch.zeros_like)):
            with hm.hooks(fwd={sae.source["layer"]: splice_hook(sae, positions, edit)}):
                other = model(x).double().log_softmax(-1)
            expected[what] = float((clean.exp() * (clean - other)).sum(-1).clamp_min(0).mean())
    assert expected["kl_bias_only"] > expected["kl"] > 0
    for what, value in expected.items():
        assert getattr(score, what) == pytest.approx(value, rel=1e-5)


def test_splice_replaces_only_the_stored_tokens():
    sae = identity_sae(4, {})
    with torch.no_grad():
        sae.b_dec.fill_(5.0)
    value = torch.randn(2, 6, 4)
    new = splice_hook(sae, torch.tensor([1, 3]), edit=torch.zeros_like)(value, name="x")
    assert torch.equal(new[:, [0, 2, 4, 5]], value[:, [0, 2, 4, 5]])
    assert torch.equal(new[:, [1, 3]], torch.full((2, 2, 4), 5.0))


def test_an_autoencoder_is_refused_for_another_model(shapes_store, tmp_path):
    model, store = shapes_store
    sae = vk.train_sae(store, expansion=1, k=4, tokens=512, batch_size=256, progress=False)
    other, _ = vk.zoo.load("vit_tiny_shapes")
    with torch.no_grad():
        other.head.bias.add_(1.0)
    with pytest.raises(ValueError, match=r"another model or input .*model\.fingerprint"):
        spliced_score(other, sae, "shapes", progress=False)
    loose = vk.train_sae(torch.randn(600, store.width), expansion=1, k=4, batch_size=256,
                         progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="rows given as a tensor"):
        spliced_score(model, loose, "shapes", progress=False)
    elsewhere = vk.cache_activations(model, "shapes", tmp_path / "s", layers=[0], progress=False)
    with pytest.raises(ValueError, match="reads blocks.2.hook_resid_post"):
        evaluate_sae(sae, elsewhere, progress=False)


def test_a_backbone_is_scored_by_its_embedding(tmp_path):
    model = tiny_vit(num_classes=0)
    images = torch.randn(12, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    store = vk.cache_activations(model, images, tmp_path / "s", tokens="class", progress=False)
    sae = vk.train_sae(store, expansion=2, k=4, batch_size=12, tokens=120, progress=False)
    score = spliced_score(model, sae, (images,), progress=False)
    assert score.kl is None and score.accuracy_clean is None
    assert -1 <= score.embedding_cosine <= 1 and "embedding_cosine" in repr(score)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(kind="sparse"), "kind must be one of topk, batchtopk, relu, matryoshka"),
        (dict(k=None), r"kind='topk' needs k"),
        (dict(b_dec="median-ish"), "b_dec must be one of median, mean, zeros"),
        (dict(batch_size=10_000), "batch_size=10000, but there are 600 rows"),
        (dict(tokens=100), "less than one batch"),
    ],
)
def test_bad_settings_are_refused(bad, match):
    rows = torch.randn(600, 8)
    settings = {"expansion": 2, "k": 4, "batch_size": 128, "progress": False, **bad}
    with pytest.raises(ValueError, match=match):
        vk.train_sae(rows, **settings)


def test_an_untrained_batchtopk_threshold_is_refused():
    sae = random_sae("batchtopk").eval()
    with pytest.raises(RuntimeError, match="no threshold yet"):
        sae.encode(torch.randn(2, sae.width))
    assert np.isnan(float(sae.threshold))


def test_the_guide_runs_and_prints_what_it_says(tmp_path, monkeypatch):
    """docs/guide/sparse-autoencoders.md: its example runs and prints what its comments say."""
    monkeypatch.chdir(tmp_path)
    printed, comments = run_first_example("sparse-autoencoders.md")
    said = [comment.removesuffix("...)") for comment in comments]
    assert printed[0] == said[0]
    fvu = float(printed[1].split("fvu=")[1].split(",")[0])
    assert printed[1].startswith("SAEScores(fvu=") and 0.05 < fvu < 0.15 and "L0=8.0" in printed[1]
    assert printed[2].startswith(said[2])
    assert (tmp_path / "sae" / "sae.json").is_file()


def test_a_checkpoint_folder_of_something_else_is_refused_not_overwritten(tmp_path):
    """Issue 69: train_sae(checkpoint=) on a folder holding a saved autoencoder overwrote it."""
    rows = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
    settings = {"expansion": 2, "k": 2, "tokens": 1024, "batch_size": 128, "progress": False}
    saved = vk.train_sae(rows, **settings).save(tmp_path / "saved")
    before = {p.name: p.read_bytes() for p in saved.iterdir()}
    with pytest.raises(ValueError, match=r"holds an autoencoder saved with sae.save\(\)"):
        vk.train_sae(rows, checkpoint=saved, **settings)
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == before
    loaded = vk.sae.SparseAutoencoder.load(saved)  # the fix the message gives
    assert loaded.latents == 16
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"is not a train_sae checkpoint folder \(it holds"):
        vk.train_sae(rows, checkpoint=tmp_path / "notes", **settings)
    with pytest.raises(ValueError, match="is a file"):
        vk.train_sae(rows, checkpoint=tmp_path / "notes" / "notes.txt", **settings)
    done = vk.train_sae(rows, checkpoint=tmp_path / "run", **settings)  # its own: resumed
    again = vk.train_sae(rows, checkpoint=tmp_path / "run", **settings)
    assert torch.equal(done.W_dec, again.W_dec)


def test_layer_counts_the_stored_layers_and_the_default_trains_enough_steps(tmp_path, monkeypatch):
    """Issue 69: layer=-1 was refused ("no layer -1"); the default on the 64-image sample
    (4,160 rows, batch 4,096) took one optimizer step."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                              num_classes=3).eval()  # fmt: skip
    store = vk.cache_activations(model, torch.randn(8, 3, 32, 32), tmp_path / "s",
                                 layers=[0, 1], progress=False)  # fmt: skip
    names = list(store.manifest["layers"])
    settings = {"expansion": 1, "k": 4, "batch_size": 32, "progress": False}
    last = vk.train_sae(store, layer=-1, tokens=64, **settings)
    assert last.source["layer"] == names[-1] == "blocks.1.hook_resid_post"
    assert vk.train_sae(store, layer=0, tokens=64, **settings).source["layer"] == names[0]
    with pytest.raises(ValueError, match=r"layer=2: the store holds 2 layers"):
        vk.train_sae(store, layer=2, tokens=64, **settings)
    training = importlib.import_module("vizkit.sae.training")
    steps, real = [], training._Run.train_step
    monkeypatch.setattr(
        training._Run, "train_step", lambda run, *a: steps.append(1) or real(run, *a)
    )
    monkeypatch.setattr(training, "DEFAULT_STEPS", 12)  # 1,000 in use
    vk.train_sae(store, **settings)  # 128 rows: the store once is 4 steps
    assert len(steps) == 12


@pytest.mark.parametrize(
    "changed, message",
    [
        ({"lr": float("nan")}, "lr must be a number in \\(0"),
        ({"lr": -1e-3}, "lr must be a number in \\(0"),
        ({"lr": 0.0}, "lr must be a number in \\(0"),
        ({"warmup": 0.9, "decay": 0.2}, "warmup \\+ decay must be at most 1"),
        ({"warmup": -0.1}, "warmup must be"),
        ({"aux_coefficient": float("inf")}, "aux_coefficient must be"),
        ({"aux_k": 65}, "aux_k must be an int in \\[0, 64\\]"),
        ({"k": 0}, "kind='topk' needs k, an int in 1..64; got 0"),
        ({"k": 2.5}, "needs k, an int"),
        ({"dead_after": 0}, "dead_after must be"),
        ({"b_dec": "middle"}, "b_dec must be one of median"),
        ({"tokens": 100}, "less than one batch"),
        ({"l1": -0.5}, "l1 must be"),
        ({"seed": -1}, "seed must be"),
    ],
)
def test_every_training_option_is_range_checked(changed, message):
    with pytest.raises((TypeError, ValueError), match=message):
        sae_settings(**changed)


def test_train_sae_refuses_a_bad_option_before_reading_a_row(monkeypatch):
    rows, _ = planted_rows(0, rows=512)
    read = []
    monkeypatch.setattr(TensorRows, "rows", lambda self, a, b: read.append((a, b)))
    for bad in ({"lr": float("nan")}, {"lr": -1.0}, {"warmup": 2.0}, {"checkpoint_every": 0}):
        with pytest.raises((TypeError, ValueError), match=next(iter(bad))):
            vk.train_sae(rows, expansion=2, k=3, batch_size=64, progress=False, **bad)
    assert read == []


def test_settings_round_trip_and_name_each_difference(tmp_path):
    settings = sae_settings(prefixes=(4, 16, 64), kind="matryoshka")
    assert TrainingSettings.from_json(settings.to_json(), "here") == settings
    other = sae_settings(prefixes=(4, 16, 64), kind="matryoshka", lr=2e-3, seed=1)
    assert settings.differences(other) == ["lr: 0.001 -> 0.002", "seed: 0 -> 1"]
    edited = {**settings.to_json(), "learning_rate": 1.0}
    del edited["lr"]
    with pytest.raises(ValueError, match=r"missing: \['lr'\]; unknown: \['learning_rate'\]"):
        TrainingSettings.from_json(edited, "checkpoint.pt")


def test_a_resume_with_another_setting_names_it(tmp_path):
    rows, _ = planted_rows(0, rows=2048)
    common = dict(expansion=2, k=3, tokens=4 * 256, batch_size=256, progress=False,
                  checkpoint=tmp_path / "run")  # fmt: skip
    vk.train_sae(rows, **common, lr=1e-3)
    with pytest.raises(ValueError, match=r"another run \(lr: 0.001 -> 0.002; saved -> given\)"):
        vk.train_sae(rows, **common, lr=2e-3)


def test_damaged_autoencoder_files_and_checkpoints_are_refused_with_the_fix(tmp_path):
    rows, _ = planted_rows(0, rows=2048)
    run = dict(expansion=2, k=3, tokens=4 * 256, batch_size=256, progress=False)
    sae = vk.train_sae(rows, **run)
    (tmp_path / "file").write_text("notes")
    with pytest.raises(ValueError, match="is a file; sae.save writes a folder"):
        sae.save(tmp_path / "file")
    for name, damage in [("sae.json", lambda b: b[:5]), ("sae.safetensors", lambda b: b[:100])]:
        folder = sae.save(tmp_path / name)
        (folder / name).write_bytes(damage((folder / name).read_bytes()))
        with pytest.raises(ValueError, match=f"{name} is damaged.*Save the autoencoder again"):
            SparseAutoencoder.load(folder)
    vk.train_sae(rows, **run, checkpoint=tmp_path / "run")
    file = tmp_path / "run" / "checkpoint.pt"
    file.write_bytes(file.read_bytes()[:300])
    with pytest.raises(ValueError, match="checkpoint.pt is damaged or not a train_sae checkpoint"):
        vk.train_sae(rows, **run, checkpoint=tmp_path / "run")
    shutil.rmtree(tmp_path / "run")  # the printed fix: the run trains from the start
    again = vk.train_sae(rows, **run, checkpoint=tmp_path / "run")
    torch.testing.assert_close(again.W_dec, sae.W_dec, rtol=0, atol=0)


@pytest.mark.parametrize("dead_count", [0, 5, 40])
def test_the_sparse_topk_step_equals_the_dense_losses(dead_count):
    """The TopK step's losses from its k (and AuxK's k_aux) latents per row, the decoder an
    embedding bag and the encoder's gradient scattered into the chosen columns, have the
    values and the gradients of the dense losses (every latent computed)."""
    sae = random_sae(width=16, latents=48).train()
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(5))
    run = _Run(sae, sae_settings(latents=48, aux_k=8))
    dead = torch.zeros(48, dtype=torch.bool)
    dead[torch.randperm(48, generator=torch.Generator().manual_seed(6))[:dead_count]] = True
    results = []
    for losses in (run._dense_losses, run._sparse_losses):
        sae.zero_grad(set_to_none=True)
        loss, fvu, *_ = losses(x, dead)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in sae.named_parameters()}
        results.append((loss.detach(), fvu.detach(), grads))
    (dense, dense_fvu, dense_grads), (sparse, sparse_fvu, sparse_grads) = results
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(sparse_fvu, dense_fvu, rtol=1e-5, atol=1e-7)
    for name, grad in dense_grads.items():
        assert float(grad.abs().max()) > 0, name
        torch.testing.assert_close(sparse_grads[name], grad, rtol=1e-4, atol=1e-6 * float(
            grad.abs().max()), msg=name)  # fmt: skip
    _, _, fired, l0 = run._sparse_losses(x, dead)
    z = sae.encode(x)
    assert torch.equal(fired, (z > 0).any(0)) and float(l0) == float((z > 0).sum(-1).float().mean())
