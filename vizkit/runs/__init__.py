"""The durable-run layer: every file vizkit writes goes through `files` (whole or not at all,
the folder synced), and every run fingerprints its model and inputs with `fingerprint`."""

from .files import replaced_whole, sync_folder, synced, write_atomically, write_json
from .fingerprint import model_fingerprint, tensor_fingerprint

__all__ = [
    "model_fingerprint",
    "replaced_whole",
    "sync_folder",
    "synced",
    "tensor_fingerprint",
    "write_atomically",
    "write_json",
]
