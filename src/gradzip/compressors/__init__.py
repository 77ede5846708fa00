"""All compressors. Importing this package registers every module in it (one method per file).

Besides the methods, its public modules are :mod:`.base` (the contract), :mod:`.registry`,
:mod:`.buckets` (bucket parameter, counting and scales) and :mod:`.grid` (the common-grid
capability the integer-sum schemes use); modules starting with ``_`` are private helpers.
"""

from __future__ import annotations

import importlib
import pkgutil

from gradzip.compressors.base import Body, Compressor
from gradzip.compressors.registry import codec_name, create, get, names, register

_INFRASTRUCTURE = {"base", "registry", "buckets", "grid", "common"}

for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _module.name not in _INFRASTRUCTURE and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Body", "Compressor", "codec_name", "create", "get", "names", "register"]
