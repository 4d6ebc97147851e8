"""The forward resumed at a block (`vizkit.analysis.resume`) against the model's whole forward
with the same edit: equal where a clean run proves the path (class token, register tokens,
LayerScale, any block's input or output), refused where a later block reads more than the
stream (a value left behind, an argument beside it, a change between blocks, a head of a
wrapper's own, CaiT's class-attention stage); `ImageOutputs` equal to `edited_outputs` either
way; the model left as it was."""

from __future__ import annotations

import pytest
import timm
import torch
from test_sae import state
from timm.models.vision_transformer import Block
from torch import nn

import vizkit as vk
from vizkit.analysis.resume import UNDECIDED, layer_run
from vizkit.sae.effects import ablation, edited_outputs, model_outputs, steering
from vizkit.sae.image_outputs import ImageOutputs

IMAGES = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def vit(**kwargs) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3,
                             num_classes=5, **kwargs).eval()  # fmt: skip


def full_edit(model: nn.Module, layer: str, edit) -> torch.Tensor:
    """The model's whole forward with ``edit`` of the activation ``layer``."""
    hm = vk.HookedModel(model)
    with torch.no_grad(), hm.hooks(fwd={layer: lambda t, *, name: edit(t)}):
        return model(IMAGES)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal to 1e-5 of the expected values' scale."""
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("layer", ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_post",
                                   "blocks.2.hook_resid_post"])  # fmt: skip
@pytest.mark.parametrize("kwargs", [{}, {"reg_tokens": 4, "init_values": 0.5}],
                         ids=["class token", "registers and LayerScale"])  # fmt: skip
def test_the_resumed_forward_equals_the_whole_one(layer, kwargs):
    model = vit(**kwargs)
    before = state(model)
    run = layer_run(model, IMAGES, layer)
    assert run.why == "" and run.resumed is not None
    assert_close(run.stream, vk.HookedModel(model).run_with_cache(IMAGES, layer)[1][layer])
    direction = torch.randn(run.stream.shape[-1], generator=torch.Generator().manual_seed(2))

    def edit(t: torch.Tensor) -> torch.Tensor:
        return t + 3 * direction  # every token, the class and register tokens too

    assert_close(run.resumed(edit(run.stream)), full_edit(model, layer, edit))
    assert state(model)[:2] == before[:2]


class Leaving(Block):
    """Keeps its output (or what ``left["keep"]`` makes of it) where a later block finds it."""

    def forward(self, x, attn_mask=None, is_causal=False):
        x = super().forward(x)
        self.left["x"] = self.left["keep"](x)
        return x


class Reading(Block):
    """Adds what an earlier block left behind."""

    def forward(self, x, attn_mask=None, is_causal=False):
        return super().forward(x) + 0.5 * self.left["x"]


class Passing(nn.Sequential):
    """Gives each block an argument beside the stream."""

    def forward(self, x):
        for block in self:
            x = block(x, attn_mask=None)
        return x


class Shifting(nn.Sequential):
    """Changes the stream between blocks."""

    def forward(self, x):
        for block in self:
            x = block(x) + 0.25
        return x


def left_behind(keep=lambda x: x) -> nn.Module:
    model, left = vit(), {"keep": keep}
    model.blocks[0].__class__, model.blocks[2].__class__ = Leaving, Reading
    model.blocks[0].left = model.blocks[2].left = left
    return model


def passing() -> nn.Module:
    model = vit()
    model.blocks = Passing(*model.blocks)
    return model


def shifting() -> nn.Module:
    model = vit()
    model.blocks = Shifting(*model.blocks)
    return model


def own_head() -> nn.Module:
    return nn.Sequential(vit(), nn.Linear(5, 3)).eval()


def batch_mean() -> nn.Module:
    return left_behind(lambda x: x.mean(0, keepdim=True))


@pytest.mark.parametrize("build, layer, why", [
    (left_behind, "blocks.1.hook_resid_post", "do not run on the stream alone"),
    (batch_mean, "blocks.1.hook_resid_post", "differs from the model's forward"),
    (passing, "blocks.1.hook_resid_post", "takes more than the stream"),
    (shifting, "blocks.1.hook_resid_post", "the first block after the layer is not given"),
    (shifting, "blocks.0.hook_resid_pre", "not given the previous block's output"),
    (own_head, "0.blocks.1.hook_resid_post", "readout does not give the model's output"),
])  # fmt: skip
def test_a_path_the_run_cannot_prove_is_refused(build, layer, why):
    model = build()
    before = state(model)
    run = layer_run(model, IMAGES, layer)
    assert run.resumed is None and why in run.why
    assert state(model)[:2] == before[:2]


def test_a_read_that_is_no_tensor_is_refused():
    """What a caller's score reads of the output (Ablation-CAM's score target: all of it) must
    be what the path gives, a tensor."""
    run = layer_run(vit(), IMAGES, "blocks.1.hook_resid_post", lambda out: {"logits": out})
    assert run.resumed is None and "readout does not give the model's output" in run.why


def test_one_image_cannot_prove_it():
    run = layer_run(vit(), IMAGES[:1], "blocks.1.hook_resid_post")
    assert run.resumed is None and run.why == UNDECIDED


@pytest.fixture(scope="module")
def sae_of(tmp_path_factory):
    """An autoencoder of ``layer`` of ``model``, trained on IMAGES."""

    def train(model: nn.Module, layer) -> vk.sae.SparseAutoencoder:
        folder = tmp_path_factory.mktemp("resume")
        store = vk.cache_activations(model, IMAGES, folder / "s", layers=[layer], tokens="all",
                                     progress=False)  # fmt: skip
        return vk.train_sae(store, expansion=2, k=4, tokens=200, batch_size=64, progress=False)

    return train


@pytest.mark.parametrize("build, layer, resumed", [
    (vit, "blocks.1.hook_resid_post", True),
    (vit, "blocks.2.hook_resid_post", True),
    (batch_mean, "blocks.1.hook_resid_post", False),
    (lambda: timm.create_model("cait_xxs24_224", img_size=32, patch_size=8, depth=3,
                               num_classes=5).eval(), "blocks.2.hook_resid_post", False),
], ids=["vit middle", "vit last", "left behind", "cait"])  # fmt: skip
def test_image_outputs_equal_the_whole_model(sae_of, build, layer, resumed):
    """Edits from the layer on where proved, through the whole model elsewhere: the same
    outputs as `edited_outputs` and `model_outputs`, each image's clean output once."""
    torch.manual_seed(0)
    model = build()
    sae = sae_of(model, layer)
    before = state(model)
    outputs = ImageOutputs(model, sae, IMAGES)
    chosen = [4, 1, 3]
    for edit, _ in (ablation(sae, [0, 2]), steering(sae, 1, 2.5)):
        assert_close(outputs.edited(chosen, edit), edited_outputs(model, sae, IMAGES[chosen], edit))
    assert (outputs.why == "") is resumed and (outputs.resumed is not None) is resumed
    assert_close(outputs.clean(chosen), model_outputs(model, IMAGES[chosen]))
    assert state(model)[:2] == before[:2]


def test_a_model_in_train_mode_is_resumed_in_eval_mode(sae_of):
    """Dropout on in train mode: the resumed path runs in eval mode, as the whole model does
    under every analysis; the model's modes are as before after."""
    model = vit(proj_drop_rate=0.5)
    sae = sae_of(model, "blocks.1.hook_resid_post")
    model.train()
    before = state(model)
    outputs = ImageOutputs(model, sae, IMAGES)
    edit, _ = steering(sae, 0, 1.5)
    assert_close(outputs.edited([0, 2], edit), edited_outputs(model, sae, IMAGES[[0, 2]], edit))
    assert outputs.why == ""
    assert state(model)[:2] == before[:2]


def test_activations_over_the_budget_are_read_again(sae_of):
    model = vit()
    sae = sae_of(model, "blocks.1.hook_resid_post")
    one = 17 * 192 * 4  # an image's activation: 17 tokens of 192 channels
    outputs = ImageOutputs(model, sae, IMAGES, max_bytes=2 * one)
    edit, _ = ablation(sae, 1)
    outputs.edited([0, 1, 2], edit)
    assert sorted(outputs.streams) == [0, 1, 2]  # those in use are kept
    outputs.edited([3], edit)
    assert sorted(outputs.streams) == [2, 3]
    assert_close(outputs.edited([0, 3], edit), edited_outputs(model, sae, IMAGES[[0, 3]], edit))
