"""The model section: what was analysed (the model, its architecture read off the modules, its
weights, the input and token layout, and a zoo model's test accuracy and training)."""

from __future__ import annotations

from torch import nn

from ..inputs import ReportInputs
from .base import Section, html_table

__all__ = ["summary"]


def summary(r: ReportInputs) -> Section:
    hm = r.hooked
    params = sum(p.numel() for p in r.model.parameters())
    layout = hm.token_layout(tuple(r.images.shape[-2:]))
    rows = {
        "model": r.name,
        "architecture": _architecture(r.model, r.card),
        "parameters": f"{params / 1e6:.2f}M",
        "weights": r.card.get("weights", "vizkit zoo (sha256 checked)"),
        "input": f"{r.source}, shape {tuple(r.images.shape)}",
        "hook names": str(len(hm.hook_names())),
    }
    if layout is not None:
        rows["tokens"] = (
            f"{layout.num_prefix_tokens} prefix + {layout.grid[0]}x{layout.grid[1]} patches"
        )
    if "test_accuracy" in r.card:
        rows["test accuracy"] = f"{r.card['test_accuracy']:.2%} on {r.card['data']['name']}"
        rows["training"] = f"{r.card['training_seconds'] / 60:.1f} min, {r.card['trained_on']}"
    return Section("Model", "What was analysed.", html=html_table(rows))


def _architecture(model: nn.Module, card: dict) -> str:
    """What the model really is: its class, the timm name it was built from with the kwargs that
    changed it, and (for ViT-like models) depth, width, heads and patch size read off the model."""
    name = card.get("architecture")
    kwargs = card.get("kwargs") or {}
    built = f"{name}({', '.join(f'{k}={v}' for k, v in kwargs.items())})" if kwargs else name
    if card.get("library"):  # a model of another library, behind vizkit's LibraryClassifier
        inner = getattr(model, "model", model)
        return f"{type(inner).__name__} ({card['library']}, {card.get('weights', 'random')})"
    parts = [type(model).__name__ + (f" = timm {built}" if name else "")]
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.Sequential | nn.ModuleList) and hasattr(model, "embed_dim"):
        heads = getattr(getattr(blocks[0], "attn", None), "num_heads", None)
        head_text = f", {heads} heads" if heads else ""
        parts.append(f"{len(blocks)} blocks, width {model.embed_dim}{head_text}")
    pe = getattr(model, "patch_embed", None)
    if pe is not None and getattr(pe, "patch_size", None) is not None:
        (ph, pw), size = pe.patch_size, getattr(pe, "img_size", None)
        parts.append(f"patch {ph}x{pw}" + (f" at {size[0]}x{size[1]}" if size else ""))
    return "; ".join(parts)
