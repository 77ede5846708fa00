"""The payloads' CRC-32 (the zlib polynomial) computed where the bytes live, with torch operations.

A device payload (:mod:`gradzip.device.payloads`) carries the same CRC-32 as a host payload, so
the checksum must be computed on the device without reading the bytes back. zlib's loop is
sequential (one table lookup per byte, each depending on the last); this module computes the
same value in parallel from the CRC's linearity over GF(2).

Write ``raw(m)`` for the CRC register after the reflected CRC-32 loop over ``m`` started from
zero (no initial value, no final XOR), and ``Z`` for one step of that loop over a zero byte,
``Z(c) = T[c & 0xff] ^ (c >> 8)`` with ``T`` zlib's table. Both are linear, so

* byte ``b`` at position ``i`` of an ``n``-byte message contributes ``Z^(n-1-i)(T[b])`` to
  ``raw(m)``, and ``raw(m)`` is the XOR of the contributions;
* zlib's ``crc32(m) = raw(m) ^ Z^n(0xFFFFFFFF) ^ 0xFFFFFFFF`` (the initial register, shifted
  through ``n`` bytes, then the final XOR);
* leading zero bytes contribute nothing, so the message is padded at the front to a whole
  number of blocks.

Only torch operations that also run on fake CUDA tensors are used (no Python indexing, no
host-to-device copy of a host tensor: see :mod:`gradzip.device`). [CHOICE] The device work is: one gather per byte from a table ``P[pos, b] = Z^(B-1-pos)(T[b])``
of ``B = 256`` positions (256 KiB of int64, built once per device), a tree of XORs within each
block (8 levels), then a tree over the blocks, where each level shifts the left half by
``Z^(B 2^level)`` through four 256-entry byte tables and XORs the right half. About 60 small
operations for any size, every value an exact integer: the result is zlib's on any device
(tested against ``zlib.crc32``). Registers are held in int64 (values below ``2**32``) because
torch's unsigned 32-bit support is partial.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from gradzip.kernels.triton_device import crc32_register, use_triton

_POLY = 0xEDB88320
#: bytes per leaf block (a power of two)
BLOCK = 256
_MASK = 0xFFFFFFFF


@functools.cache
def _byte_table() -> np.ndarray:
    """zlib's table: the register after one byte ``b`` from a zero register."""
    table = np.arange(256, dtype=np.uint64)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ _POLY, table >> 1)
    return np.asarray(table, dtype=np.uint64)


def _zero_step(c: np.ndarray) -> np.ndarray:
    """``Z``: one step of the loop over a zero byte."""
    return np.asarray(_byte_table()[c & 0xFF] ^ (c >> 8), dtype=np.uint64)


# -- linear maps of the 32-bit register, as the images of its 32 unit vectors ----------------
Map = tuple[int, ...]


def _apply(m: Map, c: int) -> int:
    out = 0
    bit = 0
    while c:
        if c & 1:
            out ^= m[bit]
        c >>= 1
        bit += 1
    return out


def _compose(a: Map, b: Map) -> Map:
    """``a after b``."""
    return tuple(_apply(a, b[j]) for j in range(32))


@functools.cache
def _zero_steps(n: int) -> Map:
    """``Z^n`` (by squaring)."""
    if n == 0:
        return tuple(1 << j for j in range(32))
    if n == 1:
        one = _zero_step(np.array([1 << j for j in range(32)], dtype=np.uint64))
        return tuple(int(v) for v in one)
    half = _zero_steps(n // 2)
    square = _compose(half, half)
    return _compose(_zero_steps(1), square) if n % 2 else square


@functools.cache
def _shift_tables(n: int) -> np.ndarray:
    """``Z^n`` as four byte tables: ``Z^n(c) = XOR_j tables[j][(c >> 8j) & 0xff]``."""
    m = _zero_steps(n)
    return np.array(
        [[_apply(m, b << (8 * j)) for b in range(256)] for j in range(4)], dtype=np.int64
    )


@functools.cache
def _leaf_table() -> np.ndarray:
    """``P[pos, b] = Z^(BLOCK-1-pos)(T[b])``, flattened (``pos * 256 + b``)."""
    rows = [_byte_table()]
    for _ in range(BLOCK - 1):
        rows.append(_zero_step(rows[-1]))
    return np.stack(rows[::-1]).astype(np.int64).reshape(-1)


_device_tables: dict[tuple[str, int | None, int], torch.Tensor] = {}


def _on(device: torch.device, key: int, table: np.ndarray) -> torch.Tensor:
    """``table`` as an int64 tensor on ``device``, copied there once (host to device only)."""
    slot = (device.type, device.index, key)
    cached = _device_tables.get(slot)
    if cached is None:
        # built from a list: under fake CUDA tensors a host tensor cannot be moved to the device
        cached = torch.tensor(table.tolist(), dtype=torch.int64, device=device)
        _device_tables[slot] = cached
    return cached


def _shift(c: torch.Tensor, n: int) -> torch.Tensor:
    """``Z^n`` applied to every register of ``c``."""
    tables = _on(c.device, n, _shift_tables(n).reshape(-1))
    out = torch.take(tables, c & 0xFF)
    for j in range(1, 4):
        out = out ^ torch.take(tables, 256 * j + ((c >> (8 * j)) & 0xFF))
    return out


#: rows of :func:`_block_shift_tables`: payloads up to ``256 * 2**40`` bytes
SHIFT_LEVELS = 40


@functools.cache
def _block_shift_tables() -> np.ndarray:
    """``Z^(BLOCK 2^j)`` as four byte tables for ``j < SHIFT_LEVELS``, flattened (the Triton
    kernel's shifts of whole blocks)."""
    return np.stack([_shift_tables(BLOCK << j) for j in range(SHIFT_LEVELS)]).reshape(-1)


def crc32_device(data: torch.Tensor) -> torch.Tensor:
    """zlib's CRC-32 of the 1-D ``uint8`` tensor ``data``, as a 0-d int64 tensor on its device.

    Reads nothing back to the host; the tables travel host to device once per device. Where the
    Triton kernels run (a CUDA tensor holding real values: :func:`~gradzip.kernels.triton_device.
    use_triton`), one kernel launch (:mod:`gradzip.kernels.triton_crc32`); elsewhere, and as the
    reference, the torch operations below.
    """
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise TypeError(
            f"crc32_device takes a 1-D uint8 tensor, not {data.dtype} of {data.dim()} dims"
        )
    n = data.numel()
    finish = _apply(_zero_steps(n), _MASK) ^ _MASK
    if use_triton(data):
        leaf = _on(data.device, -1, _leaf_table())
        return crc32_register(data, leaf, _on(data.device, -2, _block_shift_tables()), finish)
    if n == 0:
        return torch.tensor(finish, dtype=torch.int64, device=data.device)
    blocks = 1 << max(0, (-(-n // BLOCK) - 1).bit_length())
    padded = torch.nn.functional.pad(data.to(torch.int64), (blocks * BLOCK - n, 0))
    positions = torch.arange(BLOCK, dtype=torch.int64, device=data.device) * 256
    regs = torch.take(_on(data.device, -1, _leaf_table()), padded.view(blocks, BLOCK) + positions)
    width = BLOCK
    while width > 1:  # the XOR tree within each block
        width //= 2
        regs = regs.narrow(1, 0, width) ^ regs.narrow(1, width, width)
    regs = regs.view(blocks)
    span = BLOCK
    while regs.numel() > 1:  # the tree over the blocks: shift the left half past the right
        pairs = regs.view(-1, 2)
        regs = _shift(pairs.select(1, 0), span) ^ pairs.select(1, 1)
        span *= 2
    return regs.view(()) ^ finish


def crc32_bytes_device(data: torch.Tensor) -> torch.Tensor:
    """:func:`crc32_device` as the 4 little-endian bytes the wire format stores (uint8)."""
    crc = crc32_device(data)
    shifts = torch.arange(0, 32, 8, dtype=torch.int64, device=data.device)
    return ((crc >> shifts) & 0xFF).to(torch.uint8)
