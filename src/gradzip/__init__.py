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
