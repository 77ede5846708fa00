"""The registry of compressors: names (the public keys) and wire codec ids.

Codec ids are part of the wire format and never reused. Adding a compressor = one file in
``gradzip/compressors/`` with a class decorated by :func:`register`: importing the package
imports every public module in it, and the contract tests then cover the new class
automatically.

The registry holds classes and knows nothing of their behaviour; it sits above
:mod:`gradzip.compressors.base`, whose error messages name a payload's codec through
:mod:`gradzip.compressors.codec_names` (filled in here as each class is enrolled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gradzip.compressors.base import Compressor
from gradzip.compressors.codec_names import codec_name as codec_name
from gradzip.compressors.codec_names import name_codec

_BY_NAME: dict[str, type[Compressor]] = {}
_BY_ID: dict[int, type[Compressor]] = {}

C = TypeVar("C", bound="type[Compressor]")


def register(cls: C) -> C:
    """Class decorator: enrol a compressor under ``cls.name`` and ``cls.codec_id``."""
    name, codec_id = cls.name, cls.codec_id
    if not 1 <= codec_id <= 255:
        raise ValueError(f"codec id of {name} must lie in [1, 255], got {codec_id}")
    if name in _BY_NAME and _BY_NAME[name] is not cls:
        raise ValueError(f"compressor name {name!r} is already registered")
    if codec_id in _BY_ID and _BY_ID[codec_id] is not cls:
        raise ValueError(f"codec id {codec_id} is already used by {_BY_ID[codec_id].name!r}")
    _BY_NAME[name] = cls
    _BY_ID[codec_id] = cls
    name_codec(codec_id, name)
    return cls


def names() -> list[str]:
    """Registered compressor names, in codec-id order."""
    return [cls.name for _, cls in sorted(_BY_ID.items())]


def get(name: str) -> type[Compressor]:
    """The compressor class registered as ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown compressor {name!r}; known: {', '.join(names())}") from None


def create(name: str, **params: Any) -> Compressor:
    """Instantiate the compressor ``name`` with keyword parameters."""
    factory: Callable[..., Compressor] = get(name)
    return factory(**params)


def summary(cls: type[Compressor]) -> str:
    """The first paragraph of the class docstring, on one line."""
    doc = (cls.__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())
