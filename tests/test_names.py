"""Name filters: exact, glob, regex, callable, lists, negative indices, helpful errors."""

import re

import pytest
import torch

import vizkit as vk
from vizkit.hooks import resolve_names

KNOWN = [
    "hook_embed",
    "blocks.0.hook_resid_pre",
    "blocks.0.attn.hook_pattern",
    "blocks.1.hook_resid_pre",
    "blocks.1.attn.hook_pattern",
    "blocks.10.attn.hook_pattern",
    "hook_final_norm",
]


def test_exact_glob_regex_callable_list():
    assert resolve_names("hook_embed", KNOWN) == ["hook_embed"]
    assert resolve_names("blocks.*.attn.hook_pattern", KNOWN) == [
        "blocks.0.attn.hook_pattern",
        "blocks.1.attn.hook_pattern",
        "blocks.10.attn.hook_pattern",
    ]
    assert resolve_names("blocks.1?.*", KNOWN) == ["blocks.10.attn.hook_pattern"]
    assert resolve_names(re.compile(r"blocks\.[01]\..*"), KNOWN) == [
        "blocks.0.hook_resid_pre",
        "blocks.0.attn.hook_pattern",
        "blocks.1.hook_resid_pre",
        "blocks.1.attn.hook_pattern",
    ]
    assert resolve_names(lambda n: n.endswith("norm"), KNOWN) == ["hook_final_norm"]
    # lists keep canonical order, not the order given
    assert resolve_names(["hook_final_norm", "hook_embed"], KNOWN) == [
        "hook_embed",
        "hook_final_norm",
    ]


def test_negative_indices_count_from_the_last_layer():
    assert resolve_names("blocks.-1.attn.hook_pattern", KNOWN) == ["blocks.10.attn.hook_pattern"]
    assert resolve_names("blocks.-3.*", KNOWN) == [
        "blocks.0.hook_resid_pre",
        "blocks.0.attn.hook_pattern",
    ]
    with pytest.raises(KeyError, match="out of range"):
        resolve_names("blocks.-4.attn.hook_pattern", KNOWN)


def test_unknown_names_suggest_close_matches():
    with pytest.raises(KeyError, match="blocks.1.attn.hook_pattern"):
        resolve_names("blocks.1.attn.hook_patern", KNOWN)
    with pytest.raises(KeyError, match="grads=True"):
        resolve_names("blocks.1.attn.hook_pattern_grad", KNOWN)
    with pytest.raises(KeyError):
        resolve_names("decoder.*", KNOWN)
    with pytest.raises(KeyError):
        resolve_names(["hook_embed", "nope"], KNOWN)  # every element must match
    with pytest.raises(KeyError):
        resolve_names(lambda n: False, KNOWN)
    with pytest.raises(KeyError):
        resolve_names(re.compile("zzz"), KNOWN)


@pytest.mark.parametrize("bad", [3, None, [], [1, 2], {"a": 1}])
def test_bad_spec_types(bad):
    with pytest.raises(TypeError, match="names must be"):
        resolve_names(bad, KNOWN)


def test_hooked_model_errors_name_the_problem():
    model = vk.create_model("test_vit").eval()
    hm = vk.HookedModel(model)
    x = torch.randn(1, 3, 64, 64)
    with pytest.raises(KeyError, match="Did you mean"):
        hm.run_with_cache(x, names="blocks.0.attn.hook_patterns")
    with pytest.raises(KeyError):
        hm.hooks(fwd={"no.such.name": lambda t, name: t}).__enter__()
    with pytest.raises(TypeError, match="callable"):
        hm.hooks(fwd={"hook_embed": "not callable"}).__enter__()
