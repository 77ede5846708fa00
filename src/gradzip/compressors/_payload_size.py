"""The size of a payload from a tensor's shape alone, for collectives of equal-sized slots.

A transport can gather payloads in one collective of equal slots only where every
rank knows, before anything is sent, how many bytes each rank's payload takes at most. For a
codec whose body size follows from the shape and the configuration (a fixed packing: so many
bits per value, so many scales per bucket), that size is the header's (its shape, key and
parameter varints), the body's and the CRC's: :func:`framed_size`, used by
:meth:`gradzip.compressors.base.Compressor.fixed_payload_size`.

The key is the one varying part of the header that a rank cannot know for its peers: the
varint of the sender's rank. The size under the key of the group's last rank bounds every
rank's payload, since a varint's size never shrinks as its value grows (see
:meth:`gradzip.schemes.base.Scheme.payload_bound`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradzip.payload import CRC_BYTES, Header, header_size


def shape_probe(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` without values (on the meta device), for a size
    formula that reads shape, numel and dtype only: it raises if the formula reads values."""
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"a shape has no negative dimension, got {dims}")
    return torch.empty(dims, dtype=dtype, device="meta")


def framed_size(header: Header, body_bits: int) -> int:
    """Bytes of the payload of ``header`` with a body of ``body_bits`` bits (whole bytes)."""
    return header_size(header) + -(-body_bits // 8) + CRC_BYTES
