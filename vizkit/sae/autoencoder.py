"""`SparseAutoencoder`: a dictionary of ``latents`` directions for one layer's tokens.

Encoder and decoder as in Gao et al. 2024, "Scaling and evaluating sparse autoencoders"
(Sec. 2.1-2.3): ``pre = W_enc^T (s x - b_dec) + b_enc``, ``z = act(pre)``,
``x_hat = (W_dec^T z + b_dec) / s`` with unit-norm decoder rows and ``s`` the input scale that
makes the training rows' mean norm ``sqrt(width)``. The activation ``act`` is one of:

- ``"topk"``: the k largest of ``ReLU(pre)`` per token, the rest zero (Gao et al., Eq. 3);
- ``"batchtopk"``: in training the ``B k`` largest over the whole batch (Bussmann et al. 2024,
  "BatchTopK Sparse Autoencoders", Sec. 3), in use ``ReLU(pre)`` where ``pre`` exceeds the
  threshold ``theta`` estimated in training (their Eq. 5);
- ``"relu"``: ``ReLU(pre)``, made sparse by an L1 penalty in training (Bricken et al. 2023,
  "Towards Monosemanticity"; the baseline);
- ``"matryoshka"``: BatchTopK latents trained so that every prefix of the dictionary (the
  first ``prefixes[i]`` latents) reconstructs on its own (Bussmann et al. 2025, "Learning
  Multi-Level Features with Matryoshka Sparse Autoencoders"): early latents general, later
  ones more specific.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import Tensor, nn

from ..runs import write_atomically, write_json

__all__ = ["BATCH_KINDS", "KINDS", "SparseAutoencoder", "batch_topk"]

KINDS = ("topk", "batchtopk", "relu", "matryoshka")
BATCH_KINDS = ("batchtopk", "matryoshka")  # the top B*k of a batch in training, theta in use


class SparseAutoencoder(nn.Module):
    """A sparse autoencoder on rows (..., width).

    Attributes:
        kind: one of `KINDS`; ``k``: latents kept per token (None for relu).
        prefixes: for "matryoshka", the nested dictionary sizes, the last ``latents``.
        W_enc (width, latents), b_enc (latents,), W_dec (latents, width), b_dec (width,).
        input_scale: ``s``; threshold: BatchTopK's ``theta`` (nan until trained).
        source: where its rows came from (the store, layer, tokens and model), or {}.
    """

    def __init__(
        self, width: int, latents: int, kind: str = "topk", k: int | None = None,
        source: dict | None = None, seed: int = 0, prefixes: list[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}.")
        if kind == "relu" and k is not None:
            raise ValueError("kind='relu' keeps every positive latent (sparsity from L1); k=None.")
        if kind != "relu" and not (isinstance(k, int) and 1 <= k <= latents):
            raise ValueError(f"kind={kind!r} needs k, an int in 1..{latents}; got {k!r}.")
        self.kind, self.k, self.source = kind, k, dict(source or {})
        self.prefixes = matryoshka_prefixes(kind, prefixes, latents)
        generator = torch.Generator().manual_seed(seed)
        directions = torch.randn(latents, width, generator=generator)
        directions /= directions.norm(dim=1, keepdim=True)
        # Gao et al. Sec. 2.4: the encoder starts as the decoder's transpose
        self.W_dec = nn.Parameter(directions)
        self.W_enc = nn.Parameter(directions.T.clone())
        self.b_enc = nn.Parameter(torch.zeros(latents))
        self.b_dec = nn.Parameter(torch.zeros(width))
        self.register_buffer("input_scale", torch.tensor(1.0))
        self.register_buffer("threshold", torch.tensor(float("nan")))

    @property
    def width(self) -> int:
        return self.W_dec.shape[1]

    @property
    def latents(self) -> int:
        return self.W_dec.shape[0]

    def pre_activations(self, x: Tensor) -> Tensor:
        """(..., latents) ``W_enc^T (s x - b_dec) + b_enc`` of rows ``x`` (..., width)."""
        return (x.float() * self.input_scale - self.b_dec) @ self.W_enc + self.b_enc

    def activate(self, pre: Tensor) -> Tensor:
        """(..., latents) the sparse code of pre-activations ``pre`` (..., latents)."""
        positive = pre.relu()
        if self.kind == "relu":
            return positive
        if self.kind in BATCH_KINDS:
            return batch_topk(positive, self.k) if self.training else self._above_threshold(pre)
        top = positive.topk(self.k, dim=-1)
        return torch.zeros_like(positive).scatter(-1, top.indices, top.values)

    def encode(self, x: Tensor) -> Tensor:
        """(..., latents) the latents of rows ``x`` (..., width)."""
        return self.activate(self.pre_activations(x))

    def decode(self, z: Tensor) -> Tensor:
        """(..., width) the reconstruction from latents ``z``, in the rows' own scale."""
        return (z @ self.W_dec + self.b_dec) / self.input_scale

    def forward(self, x: Tensor) -> Tensor:
        """(..., width) the reconstruction of rows ``x`` (float32)."""
        return self.decode(self.encode(x))

    def save(self, folder: str | Path) -> Path:
        """Write ``sae.safetensors``, then ``sae.json`` (kind, k, sizes, source), to ``folder``,
        each whole or not at all (`vizkit.runs`)."""
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{folder} is a file; sae.save writes a folder: pass a folder path.")
        folder.mkdir(parents=True, exist_ok=True)
        weights = save({k: v.contiguous() for k, v in self.state_dict().items()})
        write_atomically(folder / "sae.safetensors", weights)
        write_json(folder / "sae.json", self.config())
        return folder

    def config(self) -> dict:
        return {"width": self.width, "latents": self.latents, "kind": self.kind, "k": self.k,
                "source": self.source, "prefixes": self.prefixes}  # fmt: skip

    @classmethod
    def load(cls, folder: str | Path) -> SparseAutoencoder:
        """The autoencoder `save` wrote to ``folder``."""
        folder = Path(folder)
        if not (folder / "sae.json").is_file():
            raise FileNotFoundError(f"No sparse autoencoder in {folder} (no sae.json).")
        fix = "Save the autoencoder again with sae.save(folder), or train it again."
        try:
            sae = cls(**json.loads((folder / "sae.json").read_text()))
        except (UnicodeDecodeError, json.JSONDecodeError, TypeError, ValueError) as error:
            raise ValueError(
                f"{folder / 'sae.json'} is damaged or edited ({error}). {fix}"
            ) from None
        try:
            sae.load_state_dict(load_file(folder / "sae.safetensors"))
        except (OSError, SafetensorError, RuntimeError) as error:
            raise ValueError(
                f"{folder / 'sae.safetensors'} is damaged, missing or of another autoencoder than "
                f"sae.json describes ({str(error)[:200]}). {fix}"
            ) from None
        return sae.eval()

    def extra_repr(self) -> str:
        k = "" if self.k is None else f", k={self.k}"
        return f"{self.kind}{k}, width={self.width}, latents={self.latents}"

    def _above_threshold(self, pre: Tensor) -> Tensor:
        if torch.isnan(self.threshold):
            raise RuntimeError(
                "This BatchTopK autoencoder has no threshold yet (it is set in training); "
                "train it with vk.train_sae, or call .train() to select the top B*k of a batch."
            )
        return pre.relu() * (pre > self.threshold)


def matryoshka_prefixes(kind: str, prefixes: list[int] | None, latents: int) -> list[int] | None:
    """The nested dictionary sizes of a Matryoshka autoencoder (default: latents / 16, / 4,
    and all), checked to rise to ``latents``; None for the other kinds."""
    if kind != "matryoshka":
        if prefixes is not None:
            raise ValueError(f"prefixes are the nested sizes of kind='matryoshka', not {kind!r}.")
        return None
    default = [max(1, latents // 16), max(1, latents // 4), latents]
    chosen = list(prefixes) if prefixes is not None else default
    chosen = sorted(set(chosen))
    if chosen[0] < 1 or chosen[-1] != latents:
        raise ValueError(
            f"prefixes must be sizes in 1..{latents}, the largest {latents} (all latents); "
            f"got {prefixes!r}."
        )
    return chosen


def batch_topk(positive: Tensor, k: int) -> Tensor:
    """(..., latents) the ``B k`` largest entries of ``positive`` (..., latents) over all its
    B rows together, the rest zero (Bussmann et al. 2024, Sec. 3)."""
    flat = positive.reshape(-1)
    top = flat.topk(k * (flat.numel() // positive.shape[-1]))
    return torch.zeros_like(flat).scatter(0, top.indices, top.values).view_as(positive)
