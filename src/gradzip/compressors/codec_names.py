"""The name of each wire codec id: which compressor wrote a payload, for error messages.

[CHOICE] A table of its own, below :mod:`gradzip.compressors.base` (which names a foreign
payload's codec when it refuses it) and :mod:`gradzip.compressors.registry` (which fills it in
as it enrols each class): the registry then imports the base class it holds, and nothing
imports back.
"""

from __future__ import annotations

_NAMES: dict[int, str] = {}


def name_codec(codec_id: int, name: str) -> None:
    """Record that payloads of ``codec_id`` are the compressor ``name``'s."""
    _NAMES[codec_id] = name


def codec_name(codec_id: int) -> str:
    """Name of the compressor owning ``codec_id`` ("unknown" if none)."""
    return _NAMES.get(codec_id, "unknown")
