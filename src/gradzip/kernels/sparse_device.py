"""The passes of top-k and rand-k on a tensor's own device (see :mod:`gradzip.device`).

Device twins of :mod:`gradzip.kernels.sparse` that slice nothing in Python and read nothing
back to the host (so they also run on fake CUDA tensors), with fixed shapes throughout:

* :func:`topk_select_device`: :func:`~gradzip.kernels.sparse.topk_select`'s indices. [CHOICE]
  Each entry gets the distinct int64 key ``(|x| bit pattern) << 32 | (2**32 - 1 - i)``: its
  order is the magnitude's, ties to the smaller index, so the ``k`` largest keys
  (``torch.topk``, whose tie breaking no longer matters: no two keys are equal) are exactly the
  kernel's selection, without the data-dependent count and ``nonzero`` of the torch twin.
* :func:`pack_indices_device` / :func:`unpack_indices_device`: ``b``-bit indices LSB-first, in
  groups of 8 (eight ``b``-bit symbols fill exactly ``b`` bytes), as
  :func:`~gradzip.kernels.sparse.pack_indices`; :func:`indices_valid_device` is the decoder's
  check (in range, strictly increasing, zero padding bits) as a 0-d flag.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

_LOW = 0xFFFFFFFF


def topk_select_device(x: torch.Tensor, k: int) -> torch.Tensor:
    """Sorted int64 indices of the ``k`` largest ``|x_i|`` of the 1-D float32 ``x`` (ties to
    the smaller index; ``x`` finite, any result for non-finite ``x``), on ``x``'s device."""
    d = x.numel()
    if k >= d:
        return torch.arange(d, dtype=torch.int64, device=x.device)
    magnitude = x.view(torch.int32).to(torch.int64) & 0x7FFFFFFF
    keys = (magnitude << 32) | (_LOW - torch.arange(d, dtype=torch.int64, device=x.device))
    top = torch.topk(keys, k, sorted=False).values
    return torch.sort(_LOW - (top & _LOW)).values


def packed_size(n: int, bits: int) -> int:
    """Bytes of ``n`` symbols of ``bits`` bits."""
    return (n * bits + 7) // 8


def pack_indices_device(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """The int64 ``idx`` (each below ``2**bits``, ``1 <= bits <= 32``) packed LSB-first into
    ``ceil(n bits / 8)`` uint8 on their device, padding bits zero."""
    n = idx.numel()
    groups = -(-n // 8)
    s = F.pad(idx.to(torch.int64) & ((1 << bits) - 1), (0, 8 * groups - n)).reshape(groups, 8)
    columns = [torch.zeros(groups, dtype=torch.int64, device=idx.device) for _ in range(bits)]
    for j in range(8):
        first = j * bits
        symbol = s.select(1, j)
        for byte in range(first // 8, (first + bits - 1) // 8 + 1):
            shift = first - 8 * byte  # where the symbol's bit 0 lies within this byte
            part = (symbol << shift) if shift >= 0 else (symbol >> -shift)
            columns[byte] = columns[byte] | (part & 0xFF)
    packed = torch.stack(columns, dim=1).to(torch.uint8).reshape(-1)
    return packed.narrow(0, 0, packed_size(n, bits))


def unpack_indices_device(data: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_indices_device`: ``n`` int64 symbols from ``data`` (uint8 of
    exactly the packed size; validated by :func:`indices_valid_device`)."""
    groups = -(-n // 8)
    raw = F.pad(data.to(torch.int64), (0, groups * bits - data.numel())).reshape(groups, bits)
    symbols = []
    for j in range(8):
        first = j * bits
        acc = torch.zeros(groups, dtype=torch.int64, device=data.device)
        for byte in range(first // 8, (first + bits - 1) // 8 + 1):
            shift = first - 8 * byte
            column = raw.select(1, byte)
            acc = acc | ((column >> shift) if shift >= 0 else (column << -shift))
        symbols.append(acc & ((1 << bits) - 1))
    return torch.stack(symbols, dim=1).reshape(-1).narrow(0, 0, n)


def indices_valid_device(data: torch.Tensor, idx: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """0-d bool: the packed ``data``'s padding bits are zero and its indices ``idx`` are below
    ``d`` and strictly increasing (the checks of ``TopK._fixed_indices``)."""
    n = idx.numel()
    ok = (idx < d).all()
    if n > 1:
        ok = ok & (idx.narrow(0, 1, n - 1) > idx.narrow(0, 0, n - 1)).all()
    tail = (n * bits) % 8
    if tail:
        last = data.narrow(0, data.numel() - 1, 1).to(torch.int64)
        ok = ok & ((last >> tail) == 0).all()
    return ok


__all__ = [
    "indices_valid_device",
    "pack_indices_device",
    "packed_size",
    "topk_select_device",
    "unpack_indices_device",
]
