"""The durable-run layer: every file vizkit writes goes through `files` (whole or not at all,
the folder synced), every run fingerprints its model and inputs with `fingerprint`, and a
run's settings are a `settings.Settings` dataclass, checked when made and compared field by
field on resume."""

from .files import replaced_whole, sync_folder, synced, write_atomically, write_json
from .fingerprint import model_fingerprint, tensor_fingerprint
from .settings import Settings, differences

__all__ = [
    "Settings",
    "differences",
    "model_fingerprint",
    "replaced_whole",
    "sync_folder",
    "synced",
    "tensor_fingerprint",
    "write_atomically",
    "write_json",
]
