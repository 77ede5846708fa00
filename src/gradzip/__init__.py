"""gradzip: gradient compressors that emit real bytes, for communication-efficient training.

Quick start::

    import torch, gradzip
    comp = gradzip.create("dqsg", M=2)
    key = gradzip.StreamKey(run_seed=7, rank=0, step=0, tensor_index=0)
    enc = comp.encode(torch.randn(1000), key)
    enc.wire_bits, enc.paper_bits, enc.entropy_bits
    g_hat = comp.decode(enc.payload, expected_key=key)

Docstrings cite the project's algorithm specification: ``spec N.N`` refers to section N.N of
``docs/spec/`` (and ``[CHOICE]``, ``[SEED]``, ... to its provenance tags, spec 0.1).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and readers see; at run time, see __getattr__
    from gradzip.accounting import Encoded
    from gradzip.compressors import Compressor, create, get, names
    from gradzip.errors import (
        CheckpointError,
        ChecksumMismatchError,
        CorruptPayloadError,
        GradzipError,
        KeyMismatchError,
        NonFiniteInputError,
        PayloadError,
        PayloadMismatchError,
        TruncatedPayloadError,
        UnknownCodecError,
        UnsupportedVersionError,
    )
    from gradzip.keys import StreamKey

#: where each public name lives. They are imported on first use (PEP 562), so that ``import
#: gradzip`` (and with it the ``gradzip`` command, which must answer ``--help``, ``--version``
#: and a mistyped option before anything heavy loads) does not import torch.
_EXPORTS = {
    "Encoded": "gradzip.accounting",
    **dict.fromkeys(("Compressor", "create", "get", "names"), "gradzip.compressors"),
    **dict.fromkeys(
        (
            "CheckpointError",
            "ChecksumMismatchError",
            "CorruptPayloadError",
            "GradzipError",
            "KeyMismatchError",
            "NonFiniteInputError",
            "PayloadError",
            "PayloadMismatchError",
            "TruncatedPayloadError",
            "UnknownCodecError",
            "UnsupportedVersionError",
        ),
        "gradzip.errors",
    ),
    "StreamKey": "gradzip.keys",
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then cached here)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gradzip' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ChecksumMismatchError",
    "Compressor",
    "CorruptPayloadError",
    "Encoded",
    "GradzipError",
    "KeyMismatchError",
    "NonFiniteInputError",
    "PayloadError",
    "PayloadMismatchError",
    "StreamKey",
    "TruncatedPayloadError",
    "UnknownCodecError",
    "UnsupportedVersionError",
    "__version__",
    "create",
    "get",
    "names",
]
