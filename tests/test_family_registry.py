"""Families as plug-ins: the registry the hook core asks (`vizkit.hooks.family`), a family added
as one module, lazy library imports, and a hook core that names no family."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from timm.layers import PatchEmbed
from timm.models.vision_transformer import Block
from torch import nn

import vizkit as vk
from vizkit.families import BlockSite, Family, FamilyLayout, families, register_family
from vizkit.hooks.family import class_key, family_layout, residual_spec
from vizkit.hooks.taps import Tap, nhwc_to_nlc

HOOKS = Path(vk.__file__).parent / "hooks"
LIBRARIES = ("timm.models", "timm.layers", "transformers", "open_clip", "torchvision")


class ToyViT(nn.Module):
    """A ViT built from timm's Block that no built-in family knows."""

    def __init__(self, dim: int = 32, depth: int = 2, heads: int = 2, classes: int = 10):
        super().__init__()
        self.patch_embed = PatchEmbed(32, 4, 3, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.num_prefix_tokens = 1
        self.stack = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.global_pool = "token"

    def forward(self, x):
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), self.patch_embed(x)], 1)
        return self.head(self.norm(self.stack(x))[:, 0])


def toy_layout(model: ToyViT) -> FamilyLayout:
    blocks = [BlockSite(f"stack.{i}") for i in range(len(model.stack))]
    embed = Tap("hook_embed", "patch_embed", shape="B Np C", prefix_tokens=0, **nhwc_to_nlc)
    return FamilyLayout("toy", blocks, [embed, Tap("hook_final_norm", "norm", shape="B N C")])


def test_a_family_registered_by_class_name_gets_names_and_analyses():
    """Registered by "module:QualName" (as a library vizkit does not import is), the family's
    layout is used; timm's Block and Attention keep their own registrations."""
    model, x = ToyViT().eval(), torch.randn(2, 3, 32, 32)
    assert vk.HookedModel(model).tap("stack.0.attn.hook_pattern").kind == "unplaced"
    register_family(Family("toy", "tests", models={class_key(ToyViT): toy_layout}))
    hm = vk.HookedModel(model)
    assert hm.family.family == "toy"
    assert hm.tap("stack.1.attn.hook_pattern").kind == "self"
    assert {"stack.0.hook_attn_out", "stack.1.hook_resid_mid", "hook_embed"} <= set(hm.hook_names())
    result = vk.attention(model, x)
    assert result.patterns.shape == (2, 2, 2, 65, 65)  # (L, B, H, N, N)
    assert vk.gradcam(model, x).maps.shape == (2, 8, 8)
    assert ("tests", "toy") in [(f.library, f.name) for f in families()]


def test_registering_again_replaces_and_a_class_has_one_family():
    class Sub(ToyViT):
        pass

    first = register_family(Family("toy_sub", "tests", models={Sub: toy_layout}))
    again = register_family(Family("toy_sub", "tests", models={Sub: toy_layout}))  # a cell rerun
    assert first in families() or again in families()
    assert sum(f.name == "toy_sub" for f in families()) == 1
    with pytest.raises(ValueError, match="registered as a models class of the tests family"):
        register_family(Family("other", "tests", models={Sub: toy_layout}))
    with pytest.raises(ValueError, match="package.module:QualName"):
        class_key("NoModule")


def test_subclasses_keep_their_nearest_registered_parent():
    """The registry walks the MRO: a user's subclass of a timm block keeps the block's layout."""

    class MyBlock(Block):
        pass

    assert residual_spec(MyBlock(32, 2)) == residual_spec(Block(32, 2))
    assert residual_spec(nn.Linear(2, 2)) is None
    assert family_layout(nn.Linear(2, 2)) is None


def test_import_vizkit_imports_no_optional_library():
    code = (
        "import sys, vizkit, timm; vizkit.HookedModel(timm.create_model('test_vit'));"
        "print(sorted(m for m in ('transformers', 'open_clip') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("path", sorted(HOOKS.glob("*.py")), ids=lambda p: p.name)
def test_the_hook_core_imports_no_model_library(path):
    """The hook core knows no family: nothing in vizkit/hooks imports a model library's model
    or layer modules (families do, under vizkit/families)."""
    imported = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
        elif isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
    assert not [m for m in imported if m.startswith(LIBRARIES)]


def test_every_timm_family_class_is_registered_once():
    """Every built-in timm family registers real classes, and no class twice."""
    timm_families = [f for f in families() if f.library == "timm"]
    assert len(timm_families) >= 24
    keys = [class_key(c) for f in timm_families for c in f.models]
    assert len(keys) == len(set(keys))
    assert family_layout(timm.create_model("test_vit")).family == "vit"


def test_a_wrapped_model_keeps_the_names_its_model_level_options_give():
    """Sites that read options off the model (EVA's RoPE, BEiT's shared position bias) read
    them off the family's root, not the user's wrapper."""
    from timm.models.beit import Beit
    from timm.models.eva import Eva

    torch.manual_seed(0)
    for model in (
        Eva(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, use_rot_pos_emb=True),
        Beit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
             use_shared_rel_pos_bias=True, use_rel_pos_bias=False),
    ):  # fmt: skip
        bare = set(vk.HookedModel(model.eval()).hook_names())
        wrapped = vk.HookedModel(nn.Sequential(nn.Identity(), model)).hook_names()
        inner = {n.removeprefix("1.") for n in wrapped if n.startswith("1.")}
        assert inner - {"hook_out"} == bare  # the wrapper also names the whole model's output
        assert any(n.endswith(("hook_content_pattern", "hook_pos_bias")) for n in bare)
