"""Hook-name snapshots per adapter: a timm change that moves a name turns CI red.

Regenerate after an intended change with VIZKIT_UPDATE_SNAPSHOTS=1 and review the diff.
"""

import os
from pathlib import Path

import pytest
from conftest import MODELS, build

import vizkit as vk

SNAPSHOTS = Path(__file__).parent / "snapshots"


@pytest.mark.parametrize("key", ["vit", "vit_reg_avg", "deit_distilled", "cait", "resnet"])
def test_hook_names_snapshot(key):
    model, _ = build(key)
    names = vk.HookedModel(model).hook_names()
    path = SNAPSHOTS / f"{MODELS[key][0]}.txt"
    if os.environ.get("VIZKIT_UPDATE_SNAPSHOTS") == "1":
        path.write_text("\n".join(names) + "\n")
    assert names == path.read_text().splitlines()


def test_names_are_unique_and_canonical(any_model):
    _, model, _ = any_model
    names = vk.HookedModel(model).hook_names()
    assert len(names) == len(set(names))
    assert all(n.rsplit(".", 1)[-1].startswith("hook_") for n in names)
    modules = dict(model.named_modules())
    for tap in map(vk.HookedModel(model).tap, names):
        assert tap.module in modules, f"{tap.name} points at missing module {tap.module}"


def test_vit_canonical_leaves_per_block(vit_model):
    _, model, _ = vit_model
    names = set(vk.HookedModel(model).hook_names())
    for i in range(len(model.blocks)):
        for leaf in [
            "hook_resid_pre",
            "attn.hook_pattern",
            "hook_attn_out",
            "hook_resid_mid",
            "hook_mlp_out",
            "hook_resid_post",
        ]:
            assert f"blocks.{i}.{leaf}" in names
    assert {"hook_embed", "hook_final_norm"} <= names


def test_hook_points_are_discovered():
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.hook_scores = vk.HookPoint()

        def forward(self, x):
            return self.hook_scores(self.lin(x))

    assert vk.HookedModel(Tiny()).hook_names() == ["lin.hook_out", "hook_scores"]
