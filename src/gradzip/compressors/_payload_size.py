"""The size of a payload from a tensor's shape alone, for collectives of equal-sized slots.

A transport can gather payloads in one collective (``all_gather_into_tensor``) only where every
rank knows, before anything is sent, how many bytes each rank's payload takes at most. For a
codec whose body size follows from the shape and the configuration (a fixed packing: so many
bits per value, so many scales per bucket), that size is the header's (its shape, key and
parameter varints), the body's and the CRC's: :func:`payload_size`.

The key is the one varying part of the header that a rank cannot know for its peers: the
varint of the sender's rank. :func:`payload_size` of the key of the group's last rank bounds
every rank's payload, since a varint's size never shrinks as its value grows (the caller's
business, see :meth:`gradzip.schemes.allgather_decode.AllGatherDecode.slot_size`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from gradzip.keys import StreamKey
from gradzip.payload import CRC_BYTES, header_size

if TYPE_CHECKING:
    from gradzip.compressors.base import Compressor


def payload_size(
    compressor: Compressor, shape: Sequence[int], dtype: torch.dtype, key: StreamKey
) -> int | None:
    """The exact bytes of ``compressor``'s payload of a tensor of ``shape`` and ``dtype``
    under ``key``, or None where the body size depends on the values
    (:attr:`~gradzip.compressors.base.Compressor.body_size_from_shape` is False: entropy and
    Rice coding, sparse selections). An empty tensor's payload is empty (0 bytes)."""
    if not compressor.body_size_from_shape:
        return None
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"a shape has no negative dimension, got {dims}")
    # a meta tensor: the size formula reads shape, numel and dtype, never values
    probe = torch.empty(dims, dtype=dtype, device="meta")
    if probe.numel() == 0:
        return 0
    body_bits = compressor.expected_body_bits(probe)
    if body_bits is None:
        return None
    header = compressor.header_for(dims, dtype, key)
    return header_size(header) + -(-body_bits // 8) + CRC_BYTES
