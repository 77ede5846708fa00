"""Philox4x32-10 with torch operations only: the device twin of :mod:`gradzip.kernels.philox`.

Same stream layout (key, counter words, domains: see :mod:`gradzip.kernels.philox`), same words,
on any device with int64 tensors. Every value stays a non-negative int64 below ``2**49``: a
32x32->64-bit product ``a*M`` is formed from the 16-bit halves of the constant ``M``
(``a*M_lo`` and ``a*M_hi`` are below ``2**48``), so nothing overflows and shifts of
non-negative values are logical shifts.
"""

from __future__ import annotations

import torch

_M0 = 0xD2511F53
_M1 = 0xCD9E8D57
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_LOW16 = 0xFFFF
_LOW32 = 0xFFFFFFFF


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a * m`` for 32-bit ``a`` (int64 tensor) and constant ``m``."""
    low = a * (m & _LOW16)  # < 2**48
    mid = a * (m >> 16)  # < 2**48; the product is low + mid * 2**16
    low = low + ((mid & _LOW16) << 16)  # < 2**49
    hi = (mid >> 16) + (low >> 32)
    return hi, low & _LOW32


def philox4x32_10_torch(
    c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor, k0: int, k1: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 on int64 tensors of 32-bit counter words (broadcasting), key ``(k0, k1)``."""
    k0 &= _LOW32
    k1 &= _LOW32
    for _ in range(10):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _W0) & _LOW32
        k1 = (k1 + _W1) & _LOW32
    return c0, c1, c2, c3


def philox_words_torch(
    seed: int, stream: int, offset: int, n: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``n`` words (int64 holding 32-bit values) of stream ``(seed, stream)`` from ``offset``."""
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    first = offset // 4
    count = (offset + n - 1) // 4 - first + 1
    blocks = torch.arange(first, first + count, dtype=torch.int64, device=device)
    words = philox4x32_10_torch(
        blocks & _LOW32,
        blocks >> 32,
        torch.full_like(blocks, stream),
        torch.zeros_like(blocks),
        seed & _LOW32,
        seed >> 32,
    )
    flat = torch.stack(words, dim=1).reshape(-1)
    start = offset % 4
    return flat.narrow(0, start, n)


def one_plus_uniform_from_halves(halves: torch.Tensor) -> torch.Tensor:
    """The float32 ``1 + (h + 1/2) * 2**-16`` of each 16-bit half ``h`` (int64), by its bit
    pattern ``0x3F800000 | (h << 7) | 0x40`` (exact; below ``2**31``, so int32 holds it)."""
    return ((halves << 7) | 0x3F800040).to(torch.int32).view(torch.float32)


def philox_one_plus_uniform_torch(
    seed: int, stream: int, offset: int, n: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``n`` float32 ``1 + u`` in ``(1, 2)`` of the float stream ``(seed, stream)`` from element
    ``offset``: element ``i`` is half ``i % 2`` (low half first) of word ``i // 2`` (see
    :mod:`gradzip.kernels.philox`)."""
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=device)
    first = offset // 2
    count = (offset + n - 1) // 2 - first + 1
    words = philox_words_torch(seed, stream, first, count, device)
    halves = torch.stack((words & _LOW16, words >> 16), dim=1).reshape(-1)
    start = offset % 2
    return one_plus_uniform_from_halves(halves.narrow(0, start, n))


def one_plus_uniform_device(seed: int, stream: int, n: int, device: torch.device) -> torch.Tensor:
    """:func:`philox_one_plus_uniform_torch` from offset 0 (``n`` float32 ``1 + u``) under the
    device path's rules: ``narrow`` for its slicing, no branch on a value."""
    words = philox_words_torch(seed, stream, 0, -(-n // 2), device)
    halves = torch.stack((words & _LOW16, words >> 16), dim=1).reshape(-1).narrow(0, 0, n)
    return one_plus_uniform_from_halves(halves)
