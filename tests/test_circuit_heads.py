"""Per-head nodes of vizkit.circuits on torch's fused nn.MultiheadAttention (torchvision's ViT,
open_clip's visual tower): against the heads written out by hand from the module's weights,
against the block's one node, and the contract: the model as it was, clear refusals."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_full_state, full_state
from torch import nn

import vizkit as vk
from vizkit.circuits import agreement, attribution_patching, circuit, exact_patching
from vizkit.models.representatives import LIBRARIES

TORCHVISION = ("torchvision", "VisionTransformer (vit_b_16)")
OPEN_CLIP = ("open_clip", "CLIP visual tower (zero-shot)")


def _library_model(library: str, name: str, seed: int = 0):
    """The library's small ViT, 2 clean images, 2 corrupted ones near them (where a first-order
    estimate should hold) and its score target (open_clip's tower by its embedding's norm: a
    backbone)."""
    built = LIBRARIES[library][name]
    torch.manual_seed(0)
    model = built.build().eval()
    generator = torch.Generator().manual_seed(seed)
    clean, noise = torch.randn(2, 2, 3, built.size, built.size, generator=generator)
    target = vk.targets.embedding_norm() if library == "open_clip" else 1
    return model, clean, clean + 0.5 * noise, target


def _open_clip_with_layer_scale():
    """open_clip's tower with a LayerScale ls_1 (random gains) between each attention module
    and the stream."""
    import open_clip

    from vizkit.models.zero_shot import zero_shot

    torch.manual_seed(0)
    clip = open_clip.model.CLIP(
        embed_dim=16,
        vision_cfg={"image_size": 32, "patch_size": 8, "width": 32, "layers": 2, "head_width": 16,
                    "ls_init_value": 1.0},
        text_cfg={"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1},
    ).eval()  # fmt: skip
    with torch.no_grad():
        for block in clip.visual.transformer.resblocks:
            block.ls_1.gamma.uniform_(0.2, 2.0)
        model = zero_shot(clip, clip.encode_text(torch.randint(0, 100, (3, 8))))
    generator = torch.Generator().manual_seed(0)
    clean, noise = torch.randn(2, 2, 3, 32, 32, generator=generator)
    return model, clean, clean + 0.5 * noise, vk.targets.embedding_norm()


MODELS = {
    "torchvision": lambda: _library_model(*TORCHVISION),
    "open_clip": lambda: _library_model(*OPEN_CLIP),
    "open_clip with LayerScale": _open_clip_with_layer_scale,
}


def _attentions(model: nn.Module) -> dict[str, nn.MultiheadAttention]:
    """Each block's path -> its attention module (open_clip's text tower left out)."""
    return {
        path.rsplit(".", 1)[0]: module
        for path, module in model.named_modules()
        if isinstance(module, nn.MultiheadAttention)
        and (".visual." in path or path.startswith("encoder."))
    }


def _score(output: torch.Tensor, target) -> torch.Tensor:
    return output[:, target] if isinstance(target, int) else target(output)


def _head_writes(attention: nn.MultiheadAttention, tokens: torch.Tensor) -> torch.Tensor:
    """(H, B, N, C) W_O^h z_h of each head, written out from the module's weights for its
    input ``tokens`` (B, N, C): z_h = softmax(q_h k_h^T / sqrt(d)) v_h."""
    heads = attention.num_heads
    q, k, v = F.linear(tokens, attention.in_proj_weight, attention.in_proj_bias).chunk(3, -1)
    q, k, v = (t.unflatten(-1, (heads, -1)).transpose(1, 2) for t in (q, k, v))  # (B, H, N, d)
    weights = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1)
    out = attention.out_proj.weight.unflatten(1, (heads, -1))  # (C, H, d)
    return torch.einsum("bhnd,chd->hbnc", weights @ v, out)


def _by_hand(model: nn.Module, x: torch.Tensor, target):
    """One run on x: per block, each head's W_O^h z_h (H, B, N, C) by hand (checked to give
    the module's output), and the score's gradient at the module's output (B, N, C)."""
    attentions = _attentions(model)
    inputs, outputs = {}, {}

    def keep(path: str):
        def hook(module, args, output):
            inputs[path], outputs[path] = args[0], output[0]

        return hook

    handles = [a.register_forward_hook(keep(p)) for p, a in attentions.items()]
    try:
        score = _score(model(x), target)
    finally:
        for handle in handles:
            handle.remove()
    paths = list(attentions)
    gradients = torch.autograd.grad(score.sum(), [outputs[p] for p in paths])
    writes = {}
    with torch.no_grad():
        for path in paths:
            writes[path] = _head_writes(attentions[path], inputs[path])
            bias = attentions[path].out_proj.bias
            torch.testing.assert_close(writes[path].sum(0) + bias, outputs[path], rtol=1e-4,
                                       atol=1e-5)  # fmt: skip
    return writes, dict(zip(paths, gradients, strict=True)), score.detach()


@pytest.mark.parametrize("kind", list(MODELS))
def test_a_heads_effects_are_its_output_written_out_by_hand(kind):
    """EAP's head node is (W_O^h z_h(corrupted) - W_O^h z_h(clean)) . dM/d(attention output),
    and exact patching of one head is that difference added to the module's output."""
    model, clean, corrupted, target = MODELS[kind]()
    writes, gradients, clean_score = _by_hand(model, clean, target)
    corrupted_writes, _, _ = _by_hand(model, corrupted, target)
    eap = attribution_patching(model, clean, corrupted, target=target, progress=False)
    exact = exact_patching(model, clean, corrupted, target=target, edges=False, progress=False)
    torch.testing.assert_close(eap.clean_score, clean_score, rtol=1e-5, atol=1e-6)
    attentions = _attentions(model)
    for path, attention in attentions.items():
        for head in range(attention.num_heads):
            delta = corrupted_writes[path][head] - writes[path][head]
            expected = (delta * gradients[path]).sum((1, 2))
            node = f"{path} head {head}"
            torch.testing.assert_close(eap.node(node), expected, rtol=1e-4, atol=2e-6)
            handle = attention.register_forward_hook(
                lambda m, args, output, delta=delta: (output[0] + delta, *output[1:]))  # fmt: skip
            try:
                with torch.no_grad():
                    patched = _score(model(clean), target)
            finally:
                handle.remove()
            torch.testing.assert_close(exact.node(node), patched - clean_score, rtol=1e-4,
                                       atol=1e-5)  # fmt: skip  # the scores' rounding


@pytest.mark.parametrize("kind", ["torchvision", "open_clip"])
def test_heads_sum_to_their_block_and_eap_ig_tracks_exact_patching(kind):
    """A block's head nodes sum to its one node (heads=False); EAP-IG's edges correlate with
    exact patching's by head: r 0.999 (torchvision) and 0.996 (open_clip) on these images,
    0.88 to 0.999 and 0.989 to 0.999 over ten seeds of them (by block: 0.49 to 0.999 and 0.985
    to 0.999; with corruptions unrelated to the clean images, 0.69 to 0.97 and 0.88 to 0.997,
    as by block)."""
    model, clean, corrupted, target = MODELS[kind]()
    by_block = attribution_patching(model, clean, corrupted, target=target, heads=False,
                                    progress=False)  # fmt: skip
    by_head = attribution_patching(model, clean, corrupted, target=target, progress=False)
    for path, attention in _attentions(model).items():
        heads = [by_head.node(f"{path} head {h}") for h in range(attention.num_heads)]
        torch.testing.assert_close(sum(heads), by_block.node(f"{path} attn"), rtol=1e-4,
                                   atol=1e-6)  # fmt: skip
    ig = attribution_patching(model, clean, corrupted, target=target, method="eap-ig",
                              progress=False)  # fmt: skip
    exact = exact_patching(model, clean, corrupted, target=target, progress=False)
    assert agreement(ig, exact, "edges").correlation > 0.8


def _calls(model, clean, corrupted, target, kept) -> list:
    """Every analysis that reads the heads, each a function of no arguments (``kept``: a
    circuit by heads of the model's graph, run on it)."""
    return [
        lambda: attribution_patching(
            model, clean, corrupted, target=target, method="eap-ig", steps=2, progress=False
        ),  # fmt: skip
        lambda: exact_patching(model, clean, corrupted, target=target, progress=False),
        lambda: kept.run(model, clean, corrupted, target=target),
    ]


def _half_circuit(model, clean, corrupted, target):
    return circuit(attribution_patching(model, clean, corrupted, target=target, progress=False),
                   0.5)  # fmt: skip


def _assert_same(model: nn.Module, before: dict) -> None:
    assert_full_state(model, before)
    attention = next(iter(_attentions(model).values()))
    tokens = torch.randn(1, 3, attention.embed_dim)
    assert attention(tokens, tokens, tokens, need_weights=False)[1] is None


@pytest.mark.parametrize("kind", ["torchvision", "open_clip"])
def test_the_model_is_left_as_it_was_also_after_a_failure(kind):
    """No hook, training flag, weight or .grad changed by any analysis reading the heads, nor
    by one stopped by an error in any of its forwards (the heads' hooks installed in most)."""
    model, clean, corrupted, target = MODELS[kind]()
    kept = _half_circuit(model, clean, corrupted, target)
    model.train()  # the analyses run it in eval mode and give it back as it came
    before = full_state(model)
    last = model.get_submodule(list(_attentions(model))[-1])
    for call in _calls(model, clean, corrupted, target, kept):
        with _forwards(last) as seen:
            call()
        _assert_same(model, before)
        for stop in range(1, len(seen) + 1):
            with _forwards(last, stop), pytest.raises(RuntimeError, match="stopped"):
                call()
            _assert_same(model, before)


@contextmanager
def _forwards(block: nn.Module, stop: int | None = None) -> Iterator[list]:
    """A list of ``block``'s forwards inside the context, an error raised in the ``stop``-th."""
    seen: list[int] = []

    def count(module, args, output):
        seen.append(1)
        if len(seen) == stop:
            raise RuntimeError("stopped")

    handle = block.register_forward_hook(count)
    try:
        yield seen
    finally:
        handle.remove()


def _unreadable(how: str) -> nn.Module:
    """torchvision's ViT with its first attention sequence-first or with a zero key added."""
    model, *_ = _library_model(*TORCHVISION)
    attention = model.encoder.layers[0].self_attention
    setattr(attention, how, how == "add_zero_attn")
    return model


@pytest.mark.parametrize(
    "how, why",
    [
        ("batch_first", r"runs sequence-first \(batch_first=False\)"),
        ("add_zero_attn", r"attends to keys beside the tokens \(bias_k or add_zero_attn\)"),
    ],
    ids=["batch_first=False", "add_zero_attn"],
)
def test_an_unreadable_multihead_attention_is_refused_and_heads_false_works(how, why):
    """A MultiheadAttention whose heads are not A_h V_h over the tokens is refused by every
    analysis, saying why and what to do; heads=False then runs."""
    readable, clean, corrupted, target = _library_model(*TORCHVISION)
    model = _unreadable(how)
    message = f"encoder_layer_0's MultiheadAttention {why}.*Use heads=False"
    for call in _calls(model, clean, corrupted, target,
                       _half_circuit(readable, clean, corrupted, target)):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            call()
    eap = attribution_patching(model, clean, corrupted, target=target, heads=False,
                               progress=False)  # fmt: skip
    exact = exact_patching(model, clean, corrupted, target=target, heads=False, progress=False)
    assert eap.upstream == exact.upstream and "encoder.layers.encoder_layer_0 attn" in eap.upstream
    assert bool(exact.edges.nan_to_num().any()) and bool(eap.nodes.isfinite().all())
    kept = circuit(eap, 1.0)
    torch.testing.assert_close(kept.run(model, clean, corrupted, target=target),
                               exact.clean_score, rtol=1e-4, atol=1e-5)  # fmt: skip
