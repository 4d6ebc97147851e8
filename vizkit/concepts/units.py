"""The units that concept methods measure (a token stream's channels, a sparse autoencoder's
latents, or a block's attention heads) and their maps over the patch grid, read by running the
model or from an activation store written beforehand (no second pass over the data)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..analysis.residual_stream import residual_blocks
from ..head_outputs import HeadInputs, ProjectionMap, head_inputs, projection_maps
from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import eval_mode
from ..hooks.inputs import model_device
from ..sae.autoencoder import SparseAutoencoder
from ..sae.evaluation import check_source
from ..sae.spliced import replaced_tokens
from ..store import ActivationStore

__all__ = ["Heads", "Units", "read_units"]


@dataclass(frozen=True)
class Heads:
    """The attention heads of ``block`` (e.g. "blocks.3") as units. Head h's map is the norm,
    at each patch token, of what it writes to the stream, |W_O^h z_h| (z_h its output before
    the output projection W_O; Elhage et al. 2021, "A Mathematical Framework for Transformer
    Circuits", Sec. 2.2: the attention output as a sum over heads; the projection's bias,
    shared by the heads, left out)."""

    block: str

    def __post_init__(self) -> None:
        if not isinstance(self.block, str):
            raise TypeError(f"Heads takes a block's name, e.g. 'blocks.3'; got {self.block!r}.")


@dataclass(frozen=True)
class Units:
    """What is measured: the units' names, the layer they are read at, ``maps``: (images
    (B, C, H, W), or None when read from a store; ``rows``, those images' indices in the probe
    set) -> the units' maps over the patch grid (B, U, gh, gw) float32, and where they are
    computed."""

    names: list[str]
    layer: str
    source: str
    maps: Callable[[Tensor | None, range], Tensor]
    device: torch.device
    stored: bool = False

    def read(self, x: Tensor | None, rows: range) -> Tensor:
        """(B, U, gh, gw) the maps of the images ``rows`` (``x``, moved to where they are
        computed; None from a store), without gradients."""
        with torch.no_grad():
            return self.maps(None if x is None or self.stored else x.to(self.device), rows)


def read_units(
    hm: HookedModel, units: object, image_size: tuple[int, int], first: Tensor | None,
    store: ActivationStore | None = None,
) -> Units:  # fmt: skip
    """The units of ``units`` (a hook name, an autoencoder or `Heads`), checked on the image
    ``first`` (1, C, H, W), or read from ``store`` (then ``first`` may be None)."""
    if not isinstance(units, (str, SparseAutoencoder, Heads)):
        raise TypeError(
            "units must be a hook name, a SparseAutoencoder or vk.concepts.Heads(block); got "
            f"{type(units).__name__}."
        )
    if isinstance(units, Heads):
        if store is not None:
            raise ValueError(
                "A store holds the stream's tokens, not each head's output: read heads from "
                "the model (store=None), or dissect the store's layer channels instead."
            )
        return _head_units(hm, units, image_size, first)
    if store is not None:
        return _stored_units(hm, units, image_size, store)
    if isinstance(units, SparseAutoencoder):
        return _latent_units(hm, units, image_size)
    name = hm.tap(units).name  # refuses an unknown name, listing the closest
    layout = hm.token_layout(image_size, name)
    with torch.no_grad():
        _, cache = hm.run_with_cache(first, [name])
    shape = tuple(cache[name].shape)
    if layout is None or len(shape) != 3 or shape[1] != layout.num_tokens:
        expected = "" if layout is None else f" with {layout.num_tokens} tokens"
        raise ValueError(
            f"{name} is {shape}, not a token stream (B, N, C){expected}: dissect a block "
            "output (<block>.hook_resid_post), a branch output or an MLP hidden layer."
        )
    names = [f"{name} {c}" for c in range(shape[2])]
    maps = lambda x, rows: _patch_maps(hm, x, name, layout)  # noqa: E731
    return Units(names, name, "channels", maps, model_device(hm.model))


def _head_units(hm: HookedModel, units: Heads, image_size: tuple[int, int], first: Tensor) -> Units:
    """Each head of ``units.block`` a unit (`Heads`), its heads' readers and projection map
    found and checked on ``first`` (1, C, H, W) (`vizkit.head_outputs`)."""
    block, blocks = units.block, residual_blocks(hm)
    if block not in blocks:
        raise ValueError(f"{block!r} is not a block of this model; its blocks: {blocks}.")
    found = head_inputs(hm, first, [block])
    layout = hm.token_layout(image_size, f"{block}.hook_attn_out")
    with torch.no_grad():
        z = _head_outputs(hm, found, first)
        _, cache = hm.run_with_cache(first, [f"{block}.hook_attn_out"])
        written = projection_maps(hm, first, found, [z], [cache[f"{block}.hook_attn_out"]])[0]
    heads = found.heads[0]
    gram = _head_grams(written, heads)  # (H, d, d)

    def maps(x: Tensor, rows: range) -> Tensor:
        parts = _head_outputs(hm, found, x).unflatten(-1, (heads, -1))  # (B, N, H, d)
        squared = torch.einsum("bnhd,hde,bnhe->bnh", parts, gram.to(parts.dtype), parts)
        norms = layout.split(squared.clamp_min(0).sqrt(), dim=1)[1]  # (B, Np, H)
        return layout.to_grid(norms.transpose(1, 2).float())

    names = [f"{block} head {h}" for h in range(heads)]
    return Units(names, f"{block}.hook_attn_out", "heads", maps, model_device(hm.model))


def _head_outputs(hm: HookedModel, found: HeadInputs, x: Tensor) -> Tensor:
    """(B, N, H d) the heads' outputs of ``found``'s one block on x (B, C, H, W)."""
    z: list[Tensor] = []
    with torch.no_grad(), found.reading(z.append):
        hm.model(x)
    if len(z) != 1:
        raise ValueError(
            f"{found.blocks[0]}'s attention ran {len(z)} times in one forward; its heads can "
            "be units only where it runs once."
        )
    return z[0]


def _head_grams(written: ProjectionMap, heads: int) -> Tensor:
    """(H, d, d) W_O^h^T W_O^h of each head h: |W_O^h z_h|^2 = z_h^T (W_O^h^T W_O^h) z_h."""
    weight = written.weight.view(written.weight.shape[0], heads, -1)  # (C, H, d)
    return torch.einsum("chd,che->hde", weight, weight)


def _latent_units(hm: HookedModel, sae: SparseAutoencoder, image_size: tuple[int, int]) -> Units:
    """Each latent of ``sae`` a unit: ``sae.encode`` of its layer's patch tokens. Refuses an
    autoencoder of another model, or one trained on no patch token."""
    positions = replaced_tokens(hm, sae, image_size)
    layer = sae.source["layer"]
    layout = hm.token_layout(image_size, layer)
    if not bool((positions >= layout.num_prefix_tokens).any()):
        raise ValueError(
            f"This autoencoder was trained on the prefix tokens of {layer} only (tokens="
            f"{sae.source.get('tokens')!r}), not on its patches; train one on a store of its "
            "patches (tokens='patches' or 'all')."
        )

    def maps(x: Tensor, rows: range) -> Tensor:
        patches = _patch_maps(hm, x, layer, layout)  # (B, C, gh, gw)
        return _encoded(sae, patches.flatten(2).transpose(1, 2), layout).to(x.device)

    return Units(_latent_names(sae), layer, "sae", maps, model_device(hm.model))


def _latent_names(sae: SparseAutoencoder) -> list[str]:
    return [f"latent {i}" for i in range(sae.latents)]


def _encoded(sae: SparseAutoencoder, tokens: Tensor, layout: TokenLayout) -> Tensor:
    """(B, latents, gh, gw) ``sae``'s latents of the patch ``tokens`` (B, Np, C)."""
    with torch.no_grad(), eval_mode(sae):
        latents = sae.encode(tokens.to(sae.W_dec.device, sae.W_dec.dtype))  # (B, Np, latents)
    return layout.to_grid(latents.transpose(1, 2).float())


def _patch_maps(hm: HookedModel, x: Tensor, name: str, layout: TokenLayout) -> Tensor:
    """(B, C, gh, gw) float32: the activation ``name`` (B, N, C) of ``x`` at each patch."""
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, [name])
    patches = layout.split(cache[name], dim=1)[1]  # (B, Np, C)
    return layout.to_grid(patches.transpose(1, 2).float())


def _stored_units(
    hm: HookedModel, units: str | SparseAutoencoder, image_size: tuple[int, int],
    store: ActivationStore,
) -> Units:  # fmt: skip
    """The units read from ``store``'s rows: its layer of ``units`` must hold every patch
    token of each image, written by this model on images of ``image_size``."""
    if not isinstance(store, ActivationStore):
        raise TypeError(f"store must be a vk.ActivationStore; got {type(store).__name__}.")
    settings = store.manifest["settings"]
    store.check(hm)
    if isinstance(units, SparseAutoencoder):
        check_source(units, settings, f"the store {store.folder}")
        layer = units.source["layer"]
    else:
        layer = hm.tap(units).name
    if list(settings["image_size"]) != list(image_size):
        raise ValueError(
            f"The store {store.folder} was written from {tuple(settings['image_size'])} images "
            f"but the concept masks are {image_size}; give masks of the stored images' size."
        )
    if layer not in store.manifest["layers"]:
        raise ValueError(
            f"The store {store.folder} holds {list(store.manifest['layers'])}, not {layer}; "
            f"write one of it (vk.cache_activations(model, images, out, layers=[{layer!r}])) "
            "or read its units from the model (store=None)."
        )
    stored = store.layer(layer)
    layout = hm.token_layout(image_size, layer)
    where = _patch_rows(stored, layout)

    def maps(x: Tensor | None, rows: range) -> Tensor:
        tokens = stored.rows(rows.start * stored.tokens_per_image,
                             rows.stop * stored.tokens_per_image)  # fmt: skip
        patches = tokens.view(len(rows), stored.tokens_per_image, -1)[:, where]  # (B, Np, C)
        if isinstance(units, SparseAutoencoder):
            return _encoded(units, patches, layout)
        return layout.to_grid(patches.transpose(1, 2).float())

    if isinstance(units, SparseAutoencoder):
        names = _latent_names(units)
    else:
        names = [f"{layer} {c}" for c in range(stored.width)]
    source = "sae" if isinstance(units, SparseAutoencoder) else "channels"
    device = units.W_dec.device if isinstance(units, SparseAutoencoder) else torch.device("cpu")
    return Units(names, layer, source, maps, device, stored=True)


def _patch_rows(store: ActivationStore, layout: TokenLayout) -> Tensor:
    """(Np,) the index among each image's stored rows of each patch, in the grid's order.
    Refuses a store that did not keep every patch of every image the same way."""
    positions = store.positions()  # (images, T)
    patches = torch.arange(layout.num_prefix_tokens, layout.num_tokens)
    same = bool((positions == positions[:1]).all())
    where = (positions[0, :, None] == patches).float().argmax(0)
    if not same or not bool((positions[0, where] == patches).all()):
        raise ValueError(
            f"The store {store.folder} kept tokens={store.manifest['settings']['tokens']!r} of "
            f"{store.name}, not every patch of each image; a unit's map needs them all: write "
            "a store with tokens='patches' or 'all'."
        )
    return where
