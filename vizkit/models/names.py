"""Model names: the closest names to a misspelt one, and timm's constructor with a clear error
when pretrained weights cannot be fetched."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

import timm
from torch import nn

__all__ = ["create_timm_model", "did_you_mean"]


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """`` Did you mean: a, b?`` with the ``names`` closest to ``name``; "" when none is close."""
    close = difflib.get_close_matches(name, list(names), n=3, cutoff=0.8)
    return f" Did you mean: {', '.join(close)}?" if close else ""


def create_timm_model(name: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model(name, **kwargs)``; where ``pretrained=True`` cannot get the weights
    (offline, not in the local cache), an OSError naming what is missing and the two ways to
    load a local file."""
    try:
        return timm.create_model(name, **kwargs)
    except Exception as error:
        if not kwargs.get("pretrained") or not _is_download_error(error):
            raise
        raise OSError(
            f"The pretrained weights of {name!r}{_hub_source(name)} are not in the local cache "
            f"and could not be downloaded ({type(error).__name__}). Load a local file instead: "
            f"vk.zoo.load({name!r}, checkpoint='weights.safetensors'), or "
            f"timm.create_model({name!r}, pretrained=True, "
            "pretrained_cfg_overlay=dict(file='weights.safetensors')). Set HF_HUB_OFFLINE=1 to "
            "fail without retrying the network."
        ) from error


def _hub_source(name: str) -> str:
    """`` (hub repository timm/...)`` where timm's pretrained config names one."""
    cfg = timm.models.get_pretrained_cfg(name)
    repository = getattr(cfg, "hf_hub_id", None)
    return f" (Hugging Face Hub repository {repository})" if repository else ""


def _is_download_error(error: Exception) -> bool:
    """Whether ``error`` is the hub or the network failing (not a wrong argument or file)."""
    kinds = {cls.__name__ for cls in type(error).__mro__}
    return bool(kinds & _DOWNLOAD_ERRORS)


# huggingface_hub's (offline, not cached, HTTP) and the standard library's network errors
_DOWNLOAD_ERRORS = {
    "LocalEntryNotFoundError",
    "OfflineModeIsEnabled",
    "HfHubHTTPError",
    "ConnectionError",
    "URLError",
    "TimeoutError",
}
