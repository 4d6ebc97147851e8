"""The model's outputs on a fixed set of images, clean and with an edit of an autoencoder's
latents, for an explorer that asks for them again and again: each image's clean output and
its activation at the autoencoder's layer computed once, and an edit run from that layer on
(`vizkit.analysis.resume`) where a clean run proved that path equal to the model's forward,
else through the whole model (`edited_outputs`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..analysis.resume import UNDECIDED, LayerRun, ResumedForward, layer_run
from ..hooks.contract import as_hooked, eval_mode
from ..hooks.inputs import check_images
from ..hooks.scores import is_backbone, model_logits, refuse_dense
from ..targets import embedding_of
from .autoencoder import SparseAutoencoder
from .effects import edited_outputs
from .spliced import replaced_tokens, splice_hook

__all__ = ["ImageOutputs", "TensorCache"]

MAX_BYTES = 256 * 2**20  # the activations kept at the layer
BATCH = 64  # images a forward


class TensorCache(dict):
    """image -> tensor, the oldest dropped by `trim` once they hold more than ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__()
        self.max_bytes = max_bytes

    def trim(self, keep: set[int]) -> None:
        """The oldest tensors but those of ``keep`` dropped until at most ``max_bytes`` are
        held."""
        held = sum(t.numel() * t.element_size() for t in self.values())
        for image in [i for i in self if i not in keep]:
            if held <= self.max_bytes:
                return
            held -= self[image].numel() * self[image].element_size()
            del self[image]


class ImageOutputs:
    """Outputs of ``model`` on ``images`` (N, C, H, W), picked by index: (n, K) logits, or
    (n, D) embeddings on a backbone (float32, on the CPU), as `vk.sae.ablate` gives them.

    Args:
        max_bytes: the activations at the layer kept, the oldest dropped first (a dropped
            image's is read again with its next edit).
    """

    def __init__(
        self, model: nn.Module, sae: SparseAutoencoder, images: Tensor, max_bytes: int = MAX_BYTES
    ) -> None:
        self.hm, self.sae = as_hooked(model), sae
        self.images = check_images(self.hm.model, images)
        self.layer = sae.source["layer"]
        refuse_dense(self.hm.model, "the feature browser's effect of a latent on the output")
        self.read = embedding_of if is_backbone(self.hm.model) else model_logits
        self.outputs: dict[int, Tensor] = {}  # image -> (K,) its clean output
        self.streams = TensorCache(max_bytes)  # image -> (N, C) its activation at the layer
        self.resumed: ResumedForward | None = None
        self.why = UNDECIDED  # why there is no resumed path ("" where there is)
        self.positions: Tensor | None = None  # (T,) the tokens the autoencoder reads

    def clean(self, chosen: list[int]) -> Tensor:
        """(n, K) the clean outputs on the images ``chosen``."""
        self._run([i for i in dict.fromkeys(chosen) if i not in self.outputs])
        self.streams.trim(set(chosen))
        return torch.stack([self.outputs[i] for i in chosen])

    def edited(self, chosen: list[int], edit: Callable[[Tensor], Tensor]) -> Tensor:
        """(n, K) the outputs with ``edit`` (`ablation`, `steering`) applied to the latents at
        every token the autoencoder reads, its error kept: from the layer on where proved."""
        if self._keeps_streams():
            self._run([i for i in dict.fromkeys(chosen) if i not in self.streams])
        if self.resumed is None:
            return edited_outputs(self.hm, self.sae, self.images[chosen], edit, BATCH)
        if self.positions is None:
            self.positions = replaced_tokens(self.hm, self.sae, tuple(self.images.shape[-2:]))
        hook = splice_hook(self.sae, self.positions, edit, keep_error=True)
        with torch.no_grad(), eval_mode(self.sae):
            stream = hook(torch.stack([self.streams[i] for i in chosen]), name=self.layer)
        edited = self.resumed(stream).float().cpu()
        self.streams.trim(set(chosen))
        return edited

    def _run(self, missing: list[int]) -> None:
        """The clean outputs and activations of the images ``missing``; the first run that can
        tell decides whether edits run from the layer on."""
        for start in range(0, len(missing), BATCH):
            batch = missing[start : start + BATCH]
            self.add(batch, layer_run(self.hm, self.images[batch], self.layer, self.read))

    def add(self, chosen: list[int], run: LayerRun) -> None:
        """The clean outputs and activations of the images ``chosen`` from a run made on
        them (`layer_run`, `vk.sae.effects.effects_and_run`)."""
        if self.why == UNDECIDED:
            self.resumed, self.why = run.resumed, run.why
        for i, output, stream in zip(chosen, self.read(run.output), run.stream, strict=True):
            self.outputs[i] = output.float().cpu()
            if self._keeps_streams():
                self.streams[i] = stream.clone()

    def _keeps_streams(self) -> bool:
        """Whether edits run from the layer on, or it is not yet known."""
        return self.why in ("", UNDECIDED)
