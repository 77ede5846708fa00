"""zlib's CRC-32 of a device payload in one Triton kernel: :func:`triton_crc32`.

The same linear algebra as the torch-ops reference :func:`gradzip.device.crc32.crc32_device`
(read its docstring for ``T``, ``Z`` and ``raw``), arranged for one launch instead of about 300
small operations (the payloads' checksums were the DDP hook's largest cost on an H200: the
reference's launches took about 2.5 ms of host time a checksum, two checksums a payload).

Count a byte's distance from the *end* of the message, ``d = n - 1 - i = 256 q + r``
(``0 <= r < 256``). Its contribution to ``raw`` is ``Z^d(T[b]) = Z^(256 q)(Z^r(T[b]))``, so

* the bytes with the same ``q`` form a block (aligned from the end, the first one short), whose
  raw register is the XOR of the leaf table's ``Z^r(T[b])`` over its bytes;
* block ``q`` is shifted by ``Z^(256 q)``, applied as the product of ``Z^(256 2^j)`` over the set
  bits ``j`` of ``q``, each one four byte-table lookups (a 32-bit linear map);
* ``raw`` is the XOR of the shifted blocks, and ``crc32 = raw ^ Z^n(0xFFFFFFFF) ^ 0xFFFFFFFF``,
  whose second part depends on ``n`` alone and is computed on the host.

A program takes :data:`GROUP` blocks, XORs its shifted registers together and XORs the result
into the output with one atomic operation; the output starts at the host's constant. XOR is
associative and commutative, so the order in which programs land changes nothing: the value is
zlib's exactly, on any device (tested against :func:`zlib.crc32`). Registers are int64 holding
values below ``2**32`` (no sign to mask after a shift). Integer operations only: nothing for
``enable_fp_fusion`` to change.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradzip.kernels.triton_dispatch import require_triton

#: bytes per block: the leaf table's positions
BLOCK_BYTES = 256
#: blocks per program [CHOICE]: 16, i.e. 4 KiB of payload a program
GROUP = 16


@triton.jit
def _xor(a, b):  # type: ignore[no-untyped-def]
    """The reductions' combining step. [CHOICE] Defined here rather than ``tl.xor_sum``:
    Triton's own combining functions are made once, in the mode of Triton's first import, and
    the tests load this module interpreted after a compiled import (see tests/kernels/
    triton_modes.py)."""
    return a ^ b


@triton.jit  # type: ignore[untyped-decorator]
def _crc32_kernel(  # type: ignore[no-untyped-def]
    data_ptr, leaf_ptr, shift_ptr, out_ptr, n, levels, GROUP: tl.constexpr
):  # fmt: skip
    """XOR into ``out_ptr[0]`` the shifted raw registers of blocks ``pid*GROUP ..`` (counted
    from the end). ``leaf_ptr[(255 - r)*256 + b] = Z^r(T[b])``; ``shift_ptr[j*1024 + k*256 + v]``
    is ``Z^(256 2^j)`` of byte ``v`` in byte lane ``k``; ``levels`` bounds the set bits of any
    block index."""
    pid = tl.program_id(0).to(tl.int64)
    q = pid * GROUP + tl.arange(0, GROUP).to(tl.int64)
    r = tl.arange(0, 256).to(tl.int64)
    i = n - 1 - (q[:, None] * 256 + r[None, :])
    inside = i >= 0
    byte = tl.load(data_ptr + i, mask=inside, other=0).to(tl.int64)
    leaf = tl.load(leaf_ptr + (255 - r[None, :]) * 256 + byte, mask=inside, other=0)
    c = tl.reduce(leaf, 1, _xor)
    for j in range(0, levels):
        table = shift_ptr + j * 1024
        shifted = (
            tl.load(table + (c & 0xFF))
            ^ tl.load(table + 256 + ((c >> 8) & 0xFF))
            ^ tl.load(table + 512 + ((c >> 16) & 0xFF))
            ^ tl.load(table + 768 + ((c >> 24) & 0xFF))
        )
        c = tl.where(((q >> j) & 1) != 0, shifted, c)
    tl.atomic_xor(out_ptr, tl.reduce(c, 0, _xor))


def triton_crc32(
    data: torch.Tensor, leaf: torch.Tensor, shifts: torch.Tensor, finish: int
) -> torch.Tensor:
    """zlib's CRC-32 of the 1-D ``uint8`` tensor ``data`` as a 0-d int64 tensor on its device.

    ``leaf`` (65,536 int64, ``P[pos, b] = Z^(255-pos)(T[b])``), ``shifts`` (int64 rows of 1,024:
    ``Z^(256 2^j)`` as four byte tables, ``j = 0, 1, ..``, at least as many rows as the block
    count's bit length) on ``data``'s device; ``finish``: ``Z^n(0xFFFFFFFF) ^ 0xFFFFFFFF``."""
    require_triton(data)
    n = data.numel()
    out = torch.full((1,), finish, dtype=torch.int64, device=data.device)
    if n == 0:
        return out.view(())
    blocks = -(-n // BLOCK_BYTES)
    levels = (blocks - 1).bit_length()
    if shifts.numel() < levels * 1024:
        raise ValueError(
            f"{levels} shift tables needed for {n} bytes, {shifts.numel() // 1024} given"
        )
    grid = (-(-blocks // GROUP),)
    _crc32_kernel[grid](data.contiguous(), leaf, shifts, out, n, levels, GROUP=GROUP)
    return out.view(())
