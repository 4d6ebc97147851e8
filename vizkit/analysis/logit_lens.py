"""The logit lens (nostalgebraist 2020; on ViTs, ViT-Prisma's per-patch lens): the model's own
head read off the residual stream after each block, as if that block were the last.

Two readings per layer: ``pooled``, the head on the whole stream, pooled as the model pools
(for a class-token model: its class token); and ``per_position``, the head on one token at a
time, that token put in every position of the stream so that a class-token read and a mean
over patches both see it alone. Where the per-patch logits of a class are high, that class is
decodable from those patches at that depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..hooks import HookedModel, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count, check_images
from ..hooks.scores import target_indices
from .residual_stream import StreamReadout, residual_blocks
from .result import Result

__all__ = ["LogitLens", "logit_lens"]

MAX_STREAM_VALUES = 2**25  # broadcast streams read at once (128 MiB of float32)


@dataclass(repr=False)
class LogitLens(Result):
    """The head on the stream after each layer.

    Attributes:
        layers: "embed" (the stream entering the first block), then each block's path (of
            the last stage, in a hierarchical model).
        pooled: (B, L + 1, K) the head on each layer's whole stream; its last layer is the
            model's output.
        per_position: (B, L + 1, N, K) the head on each token alone (prefix tokens first).
        predictions: (B,) the model's classes.
        notes: the layers left out, and why (a hierarchical model's earlier stages).
        options, layout, image_size: as every result.
    """

    layers: list[str]
    pooled: Tensor
    per_position: Tensor
    predictions: Tensor
    notes: dict[str, str] = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None

    def maps(self, target: Tensor | int | None = None) -> Tensor:
        """(B, L + 1, gh, gw) the probability of ``target`` (an int, B ints, None: the model's
        classes) read off each patch, per layer."""
        layout = self.layout
        if layout is None or layout.num_tokens != self.per_position.shape[2]:
            raise ValueError(
                "The stream's tokens are not the model's patch grid (and prefix tokens), so "
                "the per-position readings have no image map; read per_position instead."
            )
        classes = self.predictions if target is None else target_indices(self.pooled[:, -1], target)
        probs = self.per_position.softmax(-1)[..., layout.num_prefix_tokens :, :]
        index = classes.to(probs.device).view(-1, 1, 1, 1).expand(*probs.shape[:3], 1)
        return probs.gather(-1, index)[..., 0].view(*probs.shape[:2], *layout.grid)

    def first_decodable(self) -> Tensor:
        """(B,) for each image the first layer from which the pooled reading's class is the
        model's at every later layer."""
        agree = self.pooled.argmax(-1) == self.predictions[:, None]  # (B, L + 1)
        stays = agree.flip(1).cumprod(1).flip(1).bool()
        return stays.float().argmax(1)


@analysis_contract(
    classifier="the logit lens reads each layer's stream through the classifier head"
)
def logit_lens(model: nn.Module | HookedModel, x: Tensor, progress: bool = False) -> LogitLens:
    """The model's head read off the residual stream after each block, pooled and per token,
    for images x (B, C, H, W).

    Raises:
        ValueError: a model without a residual stream of blocks vizkit names.
    """
    x = check_images(model.model, x)
    progress = bool(progress)
    blocks = residual_blocks(model)
    names = [f"{blocks[0]}.hook_resid_pre", *(f"{b}.hook_resid_post" for b in blocks)]
    with torch.no_grad():
        _, cache = model.run_with_cache(x, names)
    final = cache[names[-1]].shape
    kept = [i for i, n in enumerate(names) if cache[n].shape == final]  # the head's stage
    skipped = [(["embed", *blocks])[i] for i in range(len(names)) if i not in kept]
    streams = torch.stack([cache[names[i]] for i in kept])  # (L + 1, B, N, C)
    layers, batch, tokens, width = streams.shape
    readout = StreamReadout(model, x, blocks)
    with torch.no_grad():
        pooled = torch.stack([readout(s) for s in streams], 1).float()  # (B, L + 1, K)
        # each (layer, position) a copy of the batch whose every token is that one
        singles = streams.permute(0, 2, 1, 3).reshape(layers * tokens, batch, 1, width)
        per_call = max(1, MAX_STREAM_VALUES // (batch * tokens * width))
        per_call = check_count("copies per call", per_call)
        read = []
        for start in tqdm(range(0, len(singles), per_call), desc="logit lens",
                          disable=not progress, leave=False):  # fmt: skip
            chunk = singles[start : start + per_call]
            stream = chunk.expand(-1, -1, tokens, -1).reshape(-1, tokens, width)
            read.append(readout(stream).float().view(len(chunk), batch, -1))
    per_position = torch.cat(read).view(layers, tokens, batch, -1).permute(2, 0, 1, 3)
    notes = {} if not skipped else {"skipped": (
        f"{', '.join(skipped)}: their streams are not of the final stage's shape "
        f"{tuple(final)} (earlier stages of a hierarchical model), so the head cannot read them"
    )}  # fmt: skip
    return LogitLens(
        [(["embed", *blocks])[i] for i in kept], pooled, per_position, readout.logits.argmax(-1),
        notes=notes,
        layout=model.token_layout(tuple(x.shape[-2:])), image_size=tuple(x.shape[-2:]),
    )  # fmt: skip
