"""Models of other libraries by name, for the command line and `vizkit.zoo.load`:
``transformers:<hub id or folder>`` (an image classifier, with its image processor's size and
normalization) and ``torchvision:<builder>[:<weights>]`` (e.g. ``torchvision:vit_b_16`` with
random weights, ``torchvision:vit_b_16:IMAGENET1K_V1`` with torchvision's, from its cache
offline). open_clip models need text prompts to become classifiers: build them in Python with
`vizkit.models.zero_shot`."""

from __future__ import annotations

from torch import Tensor, nn

from ..hooks.scores import model_logits

__all__ = ["LIBRARY_PREFIXES", "LibraryClassifier", "is_library_spec", "load_library_model"]

LIBRARY_PREFIXES = ("transformers", "torchvision", "open_clip")
_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


class LibraryClassifier(nn.Module):
    """A model of another library as vizkit's command line runs it: ``forward`` gives (B, K)
    logits (a transformers ``ModelOutput``'s ``logits``), and ``pretrained_cfg`` states its
    input size and normalization in timm's convention, which `vizkit.datasets` reads. The model
    itself is unchanged (``self.model``; its family is found inside)."""

    def __init__(self, model: nn.Module, card: dict) -> None:
        super().__init__()
        self.model = model
        self.pretrained_cfg = {
            "input_size": tuple(card["input_size"]), "mean": tuple(card["mean"]),
            "std": tuple(card["std"]), "crop_pct": 1.0, "interpolation": "bicubic",
            "num_classes": len(card["classes"] or ()),
        }  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        logits = model_logits(self.model(x))
        if not isinstance(logits, Tensor):
            raise TypeError(
                f"{type(self.model).__name__} returned a {type(logits).__name__} without logits."
            )
        return logits


def is_library_spec(name: object) -> bool:
    """Whether ``name`` reads ``<library>:<model>`` for a library of `LIBRARY_PREFIXES`."""
    return isinstance(name, str) and name.partition(":")[0] in LIBRARY_PREFIXES and ":" in name


def load_library_model(spec: str) -> tuple[nn.Module, dict]:
    """``(LibraryClassifier in eval mode, card)``; the card holds ``name``, ``library``,
    ``classes`` (where the model names them), ``input_size`` (3, H, W), ``mean``, ``std`` and
    ``weights``.

    Raises:
        ValueError: an unknown library or an empty model name; open_clip (no classifier).
        ImportError: the library is not installed (the message names the extra).
    """
    library, _, name = spec.partition(":")
    if library not in LIBRARY_PREFIXES or not name:
        raise ValueError(
            f"{spec!r}: expected <library>:<model> with a library of {LIBRARY_PREFIXES}, e.g. "
            "transformers:google/vit-base-patch16-224 or torchvision:vit_b_16."
        )
    if library == "open_clip":
        raise ValueError(
            f"{spec!r}: an open_clip model classifies only against text prompts. In Python: "
            "vk.models.zero_shot(clip, clip.encode_text(tokenizer(prompts))) gives a "
            "classifier every analysis and vizkit.report.build_report's sections take."
        )
    _require(library)
    model, card = (_transformers if library == "transformers" else _torchvision)(spec, name)
    return LibraryClassifier(model, card).eval(), card


def _require(library: str) -> None:
    import importlib.util

    if importlib.util.find_spec(library) is None:
        extra = "" if library == "torchvision" else f' (pip install "vizkit[{library}]")'
        raise ImportError(f"{library} is not installed{extra}.")


def _transformers(spec: str, name: str) -> tuple[nn.Module, dict]:
    import transformers

    model = transformers.AutoModelForImageClassification.from_pretrained(name).eval()
    try:
        processor = transformers.AutoImageProcessor.from_pretrained(name)
    except (OSError, ValueError):  # a folder saved without its processor
        processor = None
    size = model.config.image_size
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    mean = tuple(getattr(processor, "image_mean", None) or _IMAGENET[0])
    std = tuple(getattr(processor, "image_std", None) or _IMAGENET[1])
    labels = getattr(model.config, "id2label", None) or {}
    classes = [labels[i] for i in range(len(labels))] if labels else None
    return model, _card(spec, "transformers", classes, (height, width), mean, std, name)


def _torchvision(spec: str, name: str) -> tuple[nn.Module, dict]:
    import torchvision

    builder, _, weights = name.partition(":")
    if builder not in torchvision.models.list_models():
        raise ValueError(
            f"{spec!r}: torchvision has no model {builder!r}; torchvision.models.list_models() "
            "lists them."
        )
    model = torchvision.models.get_model(builder, weights=weights or None).eval()
    size = getattr(model, "image_size", 224)
    mean, std, classes = *_IMAGENET, None
    if weights:
        chosen = torchvision.models.get_model_weights(builder)[weights]
        transforms = chosen.transforms()
        size = transforms.crop_size[0]
        mean, std = tuple(transforms.mean), tuple(transforms.std)
        classes = list(chosen.meta.get("categories") or []) or None
    return model, _card(spec, "torchvision", classes, (size, size), mean, std, weights or "random")


def _card(spec, library, classes, size, mean, std, weights) -> dict:
    return {"name": spec, "library": library, "classes": classes, "weights": weights,
            "input_size": (3, *size), "mean": mean, "std": std}  # fmt: skip
