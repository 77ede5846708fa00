"""All compressors. Importing this package registers every module in it (one method per file)."""

from __future__ import annotations

import importlib
import pkgutil

from gradzip.compressors.base import Body, Compressor
from gradzip.compressors.registry import codec_name, create, get, names, register

_INFRASTRUCTURE = {"base", "registry", "common"}

for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _module.name not in _INFRASTRUCTURE and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Body", "Compressor", "codec_name", "create", "get", "names", "register"]
