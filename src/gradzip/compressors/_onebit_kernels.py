"""The sign-bit passes of one-bit quantization (spec 5.1): numba kernels and a torch-ops twin.

Both sides of the fixed packing touch every coordinate once:

* :func:`pack_signs`: ``bit_ic = 1[V_ic >= 0]`` packed LSB-first into little-endian 32-bit
  words per column, and the count of set bits per column, in one pass.
* :func:`expand_signs`: ``V_hat_ic = mu+_c`` where the bit is set, else ``mu-_c``, written
  straight into the output, refusing set padding bits, in one pass.

The numba kernels run one column per task (``prange``); every column is computed by one thread
in a fixed order and only integers are accumulated, so the bytes do not depend on the thread
count. [CHOICE] The torch twins (:func:`pack_signs_torch`, :func:`expand_signs_torch`) use only
integer and select operations (no float arithmetic), so they are bit-identical to the kernels on
any device; they serve tensors that are not on the CPU and are tested against the kernels on
CPU tensors.
"""

from __future__ import annotations

import numba
import numpy as np
import torch


@numba.njit(parallel=True, cache=True)
def _pack_kernel(m: np.ndarray, out: np.ndarray, n_pos: np.ndarray) -> None:
    cols, rows = m.shape
    words = (rows + 31) // 32
    for c in numba.prange(cols):
        count = 0
        for w in range(words):
            start = 32 * w
            stop = min(start + 32, rows)
            word = np.uint32(0)
            for i in range(start, stop):
                if m[c, i] >= 0:
                    word |= np.uint32(1) << np.uint32(i - start)
                    count += 1
            # little-endian whatever the host order
            out[c, 4 * w] = np.uint8(word & np.uint32(0xFF))
            out[c, 4 * w + 1] = np.uint8((word >> np.uint32(8)) & np.uint32(0xFF))
            out[c, 4 * w + 2] = np.uint8((word >> np.uint32(16)) & np.uint32(0xFF))
            out[c, 4 * w + 3] = np.uint8(word >> np.uint32(24))
        n_pos[c] = count


@numba.njit(parallel=True, cache=True)
def _expand_kernel(packed: np.ndarray, means: np.ndarray, out: np.ndarray, bad: np.ndarray) -> None:
    cols, rows = out.shape
    words = (rows + 31) // 32
    for c in numba.prange(cols):
        hi = means[c, 0]
        lo = means[c, 1]
        for w in range(words):
            word = (
                np.uint32(packed[c, 4 * w])
                | (np.uint32(packed[c, 4 * w + 1]) << np.uint32(8))
                | (np.uint32(packed[c, 4 * w + 2]) << np.uint32(16))
                | (np.uint32(packed[c, 4 * w + 3]) << np.uint32(24))
            )
            start = 32 * w
            stop = min(start + 32, rows)
            for i in range(start, stop):
                out[c, i] = hi if (word >> np.uint32(i - start)) & np.uint32(1) else lo
            if stop - start < 32 and (word >> np.uint32(stop - start)) != 0:
                bad[c] = True


def pack_signs(m: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(packed, n_pos)`` for the ``(cols, rows)`` float32 matrix ``m`` (any strides):
    ``packed`` is ``(cols, 4*ceil(rows/32))`` uint8, ``n_pos`` the set bits per column."""
    if m.device.type != "cpu":
        packed_t, n_pos_t = pack_signs_torch(m)
        return packed_t.cpu().numpy(), n_pos_t.cpu().numpy()
    cols, rows = m.shape
    packed = np.empty((cols, 4 * (-(-rows // 32))), dtype=np.uint8)
    n_pos = np.empty(cols, dtype=np.int64)
    _pack_kernel(m.numpy(), packed, n_pos)
    return packed, n_pos


def expand_signs(packed: np.ndarray, means: np.ndarray, out: np.ndarray) -> bool:
    """Fill ``out`` (``(cols, rows)`` float32, any strides) with ``mu+``/``mu-`` by the bits of
    ``packed``; ``means`` is ``(cols, 2)`` float32. Returns False if a padding bit is set."""
    bad = np.zeros(out.shape[0], dtype=np.bool_)
    _expand_kernel(packed, means, out, bad)
    return not bool(bad.any())


_SHIFTS = torch.arange(32, dtype=torch.int64)


def pack_signs_torch(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pack_signs` in torch operations on ``m``'s device (integer sums only)."""
    cols, rows = m.shape
    words = -(-rows // 32)
    bits = torch.zeros((cols, 32 * words), dtype=torch.int64, device=m.device)
    bits[:, :rows] = (m >= 0).to(torch.int64)
    n_pos = bits.sum(dim=1)
    shifts = _SHIFTS.to(m.device)
    word = (bits.view(cols, words, 32) << shifts).sum(dim=2)  # disjoint bits: exact
    octets = (word.unsqueeze(2) >> (8 * torch.arange(4, device=m.device))) & 0xFF
    return octets.to(torch.uint8).reshape(cols, 4 * words), n_pos


def expand_signs_torch(
    packed: torch.Tensor, means: torch.Tensor, rows: int
) -> tuple[torch.Tensor, bool]:
    """:func:`expand_signs` in torch operations: ``((cols, rows) float32, padding ok)``."""
    cols = packed.shape[0]
    bits = (packed.to(torch.int64).unsqueeze(2) >> torch.arange(8, device=packed.device)) & 1
    bits = bits.reshape(cols, -1)
    ok = not bool(bits[:, rows:].any())
    out = torch.where(bits[:, :rows].bool(), means[:, :1], means[:, 1:])
    return out, ok
