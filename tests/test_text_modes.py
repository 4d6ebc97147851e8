"""Nothing of the user's changed (issue 69): a CLIP in train mode goes through every text
analysis and comes back with every module's mode as it was (`vk.models.image_tower` called
``.eval()`` on the user's model: 78 modules left switched)."""

from __future__ import annotations

import timm
import torch

import vizkit as vk
from vizkit import widgets
from vizkit.datasets.captions import WordTokenizer
from vizkit.models.text_image import clip_shapes

DESCRIPTIONS = ["a circle", "a red star", "a small ring", "a dark cross"]


def modes(model: torch.nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


def test_a_train_mode_clip_comes_back_in_train_mode():
    torch.manual_seed(0)
    tokenizer = WordTokenizer()
    clip = clip_shapes(tokenizer.vocab_size, tokenizer.context_length, layers=2).train()
    clip.transformer.resblocks[0].eval()  # a mixed state, kept module by module
    before = modes(clip)
    assert any(before) and not all(before)
    x = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tower = vk.models.image_tower(clip)
    assert modes(clip) == before and tower.training
    vk.embedding_decomposition(clip, x[:2], check_heads=False)
    assert modes(clip) == before, "embedding_decomposition"
    span = vk.text_span(clip, x, DESCRIPTIONS, tokenizer=tokenizer, basis=2, progress=False)
    assert modes(clip) == before, "text_span"
    texts = vk.targets.encode_texts(clip, ["a circle", "a star"], tokenizer)
    widgets.HeadExplorer(clip, span, x, texts, ["circle", "star"], top=2)
    assert modes(clip) == before, "HeadExplorer"
    student = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1,
                                num_classes=0).eval()  # fmt: skip
    vk.text.fit_text_map(student, clip, x, held_out=0.34)
    assert modes(clip) == before, "fit_text_map"
