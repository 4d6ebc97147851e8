"""Every built-in saliency method, registered on import: each module of this package registers
its own (`saliency_method`), so a method is one file here and nothing else lists it."""

import importlib
import pkgutil

from . import __path__ as _package_path

MODULES = sorted(info.name for info in pkgutil.iter_modules(_package_path))
for _name in MODULES:
    importlib.import_module(f"{__package__}.{_name}")
