"""The ring allreduce of integer code sums (:mod:`gradzip.schemes._ring_ints`) on the device.

The same rounds, widths, keys and bytes as :func:`~gradzip.schemes._ring_ints.
ring_allreduce_ints`; the messages are device messages (:mod:`gradzip.schemes.
_device_messages`), the slices are ``split`` views put back together with ``torch.cat`` (no
Python slicing, see :mod:`gradzip.device`), and nothing is read on the host: every received
message's flag goes to the caller's :class:`~gradzip.schemes._device_messages.Checks`, and
once one fails every later message this rank sends is spoiled, so its neighbours refuse the
step as the host path's rank would (it stops sending there).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gradzip.comm.transport import Transport
from gradzip.keys import StreamKey
from gradzip.schemes._device_messages import (
    Checks,
    pack_ints_device,
    spoiled,
    unpack_ints_device,
)
from gradzip.schemes._messages import bits_for
from gradzip.schemes._slices import slice_bounds


def _exchange(transport: Transport, nxt: int, message: torch.Tensor, prv: int) -> torch.Tensor:
    """One ring round with a device message (the transport passes tensors through)."""
    got = transport.exchange_bytes(nxt, message, prv, "allreduce")
    if not isinstance(got, torch.Tensor):
        raise TypeError(
            "the transport turned a device message into host bytes; it must pass uint8 tensors "
            "through as they are"
        )
    return got


def ring_allreduce_ints_device(
    transport: Transport,
    values: torch.Tensor,
    max_value: int,
    key: Callable[[int, int], StreamKey],
    checks: Checks,
) -> torch.Tensor:
    """The element-wise sum over ranks of ``values`` (integers in ``[0, max_value]``), int32
    on their device, bit for bit the host ring's (see the module)."""
    size, rank = transport.world_size, transport.rank
    acc = values.to(torch.int32)
    if size == 1:
        return acc.clone()
    bounds = slice_bounds(acc.numel(), size)
    parts = list(torch.split(acc, [hi - lo for lo, hi in bounds]))
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for k in range(size - 1):
        send, recv = (rank - k) % size, (rank - k - 1) % size
        bits = bits_for((k + 1) * max_value)
        message = spoiled(pack_ints_device(parts[send], bits, key(rank, send)), checks.all_ok())
        got = _exchange(transport, nxt, message, prv)
        n = parts[recv].numel()
        parts[recv] = parts[recv] + unpack_ints_device(got, n, bits, key(prv, recv), checks)
    bits = bits_for(size * max_value)
    owned = (rank + 1) % size  # the slice whose sum this rank completed
    message = spoiled(
        pack_ints_device(parts[owned], bits, key(rank, size + owned)), checks.all_ok()
    )
    for k in range(size - 1):
        message = _exchange(transport, nxt, message, prv)
        piece = (rank - k) % size
        n = parts[piece].numel()
        parts[piece] = unpack_ints_device(
            message, n, bits, key((piece - 1) % size, size + piece), checks
        )
        if k < size - 2:  # forwarded once more
            message = spoiled(message, checks.all_ok())
    return torch.cat(parts)
