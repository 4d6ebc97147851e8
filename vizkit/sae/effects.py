"""What a latent does to the prediction: its direct effect on each logit (its decoder direction
read through the frozen head, as direct logit attribution reads a block's output), and
interventions on the user's unmodified model: ablate latents, or add one (steer), at the tokens
the autoencoder reads, keeping the autoencoder's error in place."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..analysis.linear_head import first_tokens_head
from ..analysis.residual_stream import StreamReadout, check_close, residual_blocks, stream_run
from ..analysis.resume import LayerRun, block_calls, proved_run
from ..hooks import HookedModel
from ..hooks.contract import analysis_contract, eval_mode
from ..hooks.inputs import check_count, check_images, check_number
from ..hooks.scores import is_backbone, model_logits, refuse_dense
from ..targets import embedding_of
from .autoencoder import SparseAutoencoder
from .spliced import replaced_tokens, splice_hook

__all__ = ["Intervention", "LogitEffects", "ablate", "effects_and_run", "logit_effects", "steer"]

MAX_BYTES = 256 * 2**20  # what one pass over the head's Jacobian holds


@dataclass(repr=False)
class LogitEffects:
    """``effects`` (classes, latents): the change of each logit of ``classes`` when one unit
    of a latent's activation is added at every token the autoencoder reads, through the direct
    path (later blocks skipped) and the head with its norms frozen at their scale on the
    images, averaged over the images."""

    effects: Tensor
    layer: str
    images: int
    classes: list[int]

    def __repr__(self) -> str:
        classes, latents = self.effects.shape
        return f"LogitEffects({latents} latents x {classes} classes at {self.layer})"

    def top_classes(self, latent: int, count: int = 5) -> list[tuple[int, float]]:
        """(class, effect) of the classes the latent raises most."""
        top = self.effects[:, latent].topk(min(count, len(self.effects)))
        return [(self.classes[int(r)], float(v))
                for v, r in zip(top.values, top.indices, strict=True)]  # fmt: skip

    def by_class(self, cls: int, descending: bool = True) -> Tensor:
        """(latents,) the latents ordered by their effect on class ``cls``, largest first."""
        if cls not in self.classes:
            raise ValueError(f"Class {cls} was not among the classes measured {self.classes}.")
        row = self.effects[self.classes.index(cls)]
        return row.argsort(descending=descending, stable=True)


_THROUGH_THE_HEAD = "logit effects read each decoder direction through the head"


@analysis_contract(videos=True, classifier=_THROUGH_THE_HEAD)
def logit_effects(
    model: nn.Module | HookedModel, sae: SparseAutoencoder, x: Tensor,
    classes: Sequence[int] | None = None,
) -> LogitEffects:  # fmt: skip
    """The direct effect of each latent of ``sae`` on each logit (or on those of ``classes``),
    its norms frozen on images ``x`` (B, C, H, W): every decoder direction through the head
    made linear, one matrix product for every class (`vizkit.analysis.linear_head`; a head
    that does not read a first few tokens alone: one backward of it per class).

    Raises:
        ValueError: the autoencoder reads no block's output (the direct path starts at the
            residual stream), or the model's stream is not one sum of block outputs.
    """
    x = check_images(model.model, x)
    blocks, positions = _direct_path(model, sae, x)
    readout = stream_run(model, x, blocks).readout(model, x, blocks)  # the parts dropped
    return _effects(sae, x, positions, readout, classes)


@analysis_contract(videos=True, classifier=_THROUGH_THE_HEAD)
def effects_and_run(
    model: nn.Module | HookedModel, sae: SparseAutoencoder, x: Tensor
) -> tuple[LogitEffects, LayerRun]:
    """`logit_effects` of every class on images x (B, C, H, W) and, from the same forward,
    the `LayerRun` at the autoencoder's layer (`vizkit.analysis.resume`): each image's output
    and activation there, and the forward from there where the run proves it."""
    x = check_images(model.model, x)
    blocks, positions = _direct_path(model, sae, x)
    readout, run = _readout_and_run(model, x, blocks, sae.source["layer"])
    return _effects(sae, x, positions, readout, None), run


def _readout_and_run(
    hm: HookedModel, x: Tensor, blocks: list[str], layer: str
) -> tuple[StreamReadout, LayerRun]:
    """The `StreamReadout` and the `LayerRun` at ``layer`` of one clean run of x (the
    stream's parts dropped on return)."""
    with block_calls(hm, layer) as calls:
        run = stream_run(hm, x, blocks, [layer])
    resumable = proved_run(hm, x, layer, calls, run.output, run.acts[layer])
    return run.readout(hm, x, blocks), resumable


def _direct_path(hm: HookedModel, sae: SparseAutoencoder, x: Tensor) -> tuple[list[str], Tensor]:
    """(the residual blocks, the token positions the autoencoder reads), where its layer is a
    block's input or output; else ValueError."""
    positions = replaced_tokens(hm, sae, tuple(x.shape[-2:]))
    blocks = residual_blocks(hm)
    streams = {f"{b}.{leaf}" for b in blocks for leaf in ("hook_resid_pre", "hook_resid_post")}
    if sae.source["layer"] not in streams:
        raise ValueError(
            f"This autoencoder reads {sae.source['layer']}, not a block's input or output: a "
            "direct effect on the logits is defined for the residual stream only (e.g. "
            f"{blocks[-1]}.hook_resid_post). Use vk.sae.ablate or vk.sae.steer for its "
            "effect through the model."
        )
    return blocks, positions


def _effects(
    sae: SparseAutoencoder, x: Tensor, positions: Tensor, readout: StreamReadout,
    classes: Sequence[int] | None,
) -> LogitEffects:  # fmt: skip
    """`logit_effects` through the frozen head of a clean run of images x."""
    directions = (sae.W_dec / sae.input_scale).detach().to(x.device)  # (latents, C)
    count = readout.logits.shape[-1]
    chosen = list(range(count)) if classes is None else list(classes)
    if not chosen or not all(isinstance(c, numbers.Integral) and 0 <= c < count for c in chosen):
        raise ValueError(f"classes must be indices in 0..{count - 1}; got {classes!r}.")
    reads = _summed_gradients(readout, positions, chosen)  # (classes, C)
    return LogitEffects((reads.to(directions.dtype) @ directions.T).cpu(), sae.source["layer"],
                        len(x), chosen)  # fmt: skip


def _summed_gradients(readout: StreamReadout, positions, classes: list[int]) -> Tensor:
    """(K, C) each class logit's gradient with respect to the stream, summed over the tokens
    ``positions`` and averaged over the images: from the head made linear at once where it
    reads a first few tokens (`first_tokens_head`, checked to give the logits), else one
    backward of the head per class."""
    head = first_tokens_head(readout, readout.logits.shape[-1], MAX_BYTES, {})
    if head is None:
        rows = []
        for cls in classes:
            gradient, _ = readout.linear_score(lambda out, c=cls: out[:, c].float())
            rows.append(gradient[:, positions].sum(1).mean(0))
        return torch.stack(rows)
    stream = readout.stream.float()
    with torch.no_grad():
        constant = model_logits(readout(torch.zeros_like(stream), frozen=True)).float()
    check_close("The head made linear", head(stream[None])[:, 0] + constant,
                readout.logits.float(), "the logits", "the head is not affine in the stream "
                "once its norms are frozen (an attention-pooling or MLP head)")  # fmt: skip
    weights = head.weights[:, :, positions].sum(-1)  # (B, K reads)
    summed = torch.einsum("bk,bkdc->dc", weights, head.maps.expand(len(weights), -1, -1, -1))
    return summed[classes] / len(weights)


@dataclass(repr=False)
class Intervention:
    """The model's outputs on images without and with an edit of latents.

    Attributes:
        clean, edited: (B, K) logits, or (B, D) embeddings on a backbone (``output`` says
            which); what: the edit, in words.
    """

    clean: Tensor
    edited: Tensor
    what: str
    output: str = "logits"

    def __repr__(self) -> str:
        if self.output == "embedding":
            cosine = float(self.cosine().mean())
            said = f"mean cosine of the edited to the clean embedding {cosine:.3f}"
        else:
            changed = int((self.clean.argmax(-1) != self.edited.argmax(-1)).sum())
            said = f"top-1 class changed on {changed} of {len(self.clean)} images"
        return f"Intervention({self.what}: {said})"

    def cosine(self) -> Tensor:
        """(B,) the cosine of each image's edited output to its clean one."""
        return torch.nn.functional.cosine_similarity(self.edited, self.clean, dim=-1)

    def probability_change(self) -> Tensor:
        """(B, K) edited minus clean class probabilities."""
        self._require_logits()
        return self.edited.softmax(-1) - self.clean.softmax(-1)

    def mean_probability(self, cls: int) -> tuple[float, float]:
        """(clean, edited) mean probability of class ``cls`` over the images."""
        self._require_logits()
        clean, edited = self.clean.softmax(-1)[:, cls], self.edited.softmax(-1)[:, cls]
        return float(clean.mean()), float(edited.mean())

    def _require_logits(self) -> None:
        if self.output != "logits":
            raise ValueError(
                "This model is a backbone: its outputs are embeddings, whose softmax is no "
                "class probability. Compare them with .cosine(), or read a class through a "
                "head of your own (e.g. a linear probe on .clean and .edited)."
            )


@analysis_contract(videos=True)
def ablate(
    model: nn.Module | HookedModel, sae: SparseAutoencoder, x: Tensor, latents: int | Sequence[int],
    batch_size: int = 64,
) -> Intervention:  # fmt: skip
    """Set ``latents`` to zero at every token ``sae`` reads of images ``x`` (B, C, H, W): the
    activation loses ``z_i W_dec,i / s`` there and keeps the rest, the autoencoder's error
    included. On a backbone the outputs compared are its embeddings."""
    edit, what = ablation(sae, latents)
    return _intervened(model, sae, x, edit, what, batch_size)


@analysis_contract(videos=True)
def steer(
    model: nn.Module | HookedModel, sae: SparseAutoencoder, x: Tensor, latent: int,
    strength: float, batch_size: int = 64,
) -> Intervention:  # fmt: skip
    """Add ``strength`` to ``latent`` at every token ``sae`` reads of images ``x``: the
    activation gains ``strength W_dec,i / s`` there (a negative strength removes it;
    `vk.sae.features` gives each latent's typical activation to size it by)."""
    edit, what = steering(sae, latent, strength)
    return _intervened(model, sae, x, edit, what, batch_size)


def ablation(sae: SparseAutoencoder, latents: int | Sequence[int]) -> tuple[Callable, str]:
    """(the latent edit that zeroes ``latents``, what it does in words), checked."""
    chosen = _latents(sae, latents, "latents")

    def zeroed(z: Tensor) -> Tensor:
        z = z.clone()
        z[..., chosen] = 0
        return z

    return zeroed, f"ablate latents {chosen}"


def steering(sae: SparseAutoencoder, latent: int, strength: float) -> tuple[Callable, str]:
    """(the latent edit that adds ``strength`` to ``latent``, what it does in words), checked."""
    chosen = check_count("latent", latent, 0, sae.latents - 1)
    strength = check_number("strength", strength)  # nan or inf: NaN logits, reported as a change

    def added(z: Tensor) -> Tensor:
        z = z.clone()
        z[..., chosen] += strength
        return z

    return added, f"steer latent {chosen} by {strength:g}"


def _latents(sae: SparseAutoencoder, latents: int | Sequence[int], name: str) -> list[int]:
    """``latents`` (an index or a non-empty list of them) checked against the autoencoder's
    latents: a float (1.5 steered latent 1 before), a bool or an index out of range refused."""
    chosen = list(latents) if isinstance(latents, (list, tuple, range)) else [latents]
    if not chosen:
        raise ValueError(f"{name} is empty; pass at least one latent in 0..{sae.latents - 1}.")
    return [check_count(name, i, 0, sae.latents - 1) for i in chosen]


def _intervened(
    hm: HookedModel, sae: SparseAutoencoder, x: Tensor, edit: Callable[[Tensor], Tensor],
    what: str, batch_size: int,
) -> Intervention:  # fmt: skip
    x = check_images(hm.model, x)
    batch_size = check_count("batch_size", batch_size)
    clean = model_outputs(hm, x, batch_size)
    edited = edited_outputs(hm, sae, x, edit, batch_size)
    return Intervention(clean, edited, f"{what} at {sae.source['layer']}",
                        "embedding" if is_backbone(hm.model) else "logits")  # fmt: skip


@analysis_contract(videos=True)
def model_outputs(model: nn.Module | HookedModel, x: Tensor, batch_size: int = 64) -> Tensor:
    """(B, K) the model's logits on images x, or (B, D) embeddings on a backbone (float32, on
    the CPU), ``batch_size`` images a forward."""
    refuse_dense(model.model, "an autoencoder's effect on the output")
    read = embedding_of if is_backbone(model.model) else model_logits
    with torch.no_grad():
        return torch.cat([read(model.model(batch)).float().cpu()
                          for batch in x.split(check_count("batch_size", batch_size))])  # fmt: skip


@analysis_contract(videos=True)
def edited_outputs(
    model: nn.Module | HookedModel, sae: SparseAutoencoder, x: Tensor,
    edit: Callable[[Tensor], Tensor], batch_size: int = 64,
) -> Tensor:  # fmt: skip
    """`model_outputs` with ``edit`` (`ablation`, `steering`) applied to ``sae``'s latents at
    every token it reads, its error kept."""
    x = check_images(model.model, x)
    hook = splice_hook(sae, replaced_tokens(model, sae, tuple(x.shape[-2:])), edit,
                       keep_error=True)  # fmt: skip
    refuse_dense(model.model, "an autoencoder's effect on the output")
    read = embedding_of if is_backbone(model.model) else model_logits
    edited = []
    with torch.no_grad(), eval_mode(sae), model.hooks(fwd={sae.source["layer"]: hook}):
        for batch in x.split(check_count("batch_size", batch_size)):
            edited.append(read(model.model(batch)).float().cpu())
    return torch.cat(edited)
