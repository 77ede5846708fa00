"""Bits per round of the inner message: the paper's formulas and this library's exact bodies.

These are what measurements are *checked against*; reported bits always come from the
transports' meters.

``paper_bits_per_round`` (spec 3.3, Table 1 [SEED prose; formulas RECON]), summed over the
``M`` workers, for ``d`` coordinates at ``b`` bits:

* (a) broadcast: ``M(M-1)(b d + 32)``: every worker's ``delta`` and codes to each of ``M - 1``
  peers;
* (b) parameter server, integer sum: ``M(64 + b d + (b + ceil(log2 M)) d)``: per worker, its
  ``||u||_inf`` up and the common ``delta`` down (64), its codes up, the sum down with
  ``ceil(log2 M)`` overflow bits;
* (c) parameter server, re-quantized: ``M(64 + 2 b d)``;
* fp32 broadcast: ``32 d M(M-1)``.

``body_bits_per_round`` is what this implementation's payload bodies hold: the same, with each
code block padded to whole bytes, and for (b)/(c) only ``M - 1`` workers, since the server is
one of the ranks and its own messages stay local. The sum's width is
``ceil(log2(2 s M + 1)) <= b + ceil(log2 M)`` (equal for every ``M >= 2`` with
``s = 2^(b-1) - 1``). On the wire every message adds its header, CRC and an 8-byte length
prefix.
"""

from __future__ import annotations

import math

from gradzip.algorithms.svrg.channel import SCHEMES


def _check(scheme: str, workers: int, d: int, b: int) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; choose one of {SCHEMES}")
    if workers < 1 or d < 0 or not 2 <= b <= 32:
        raise ValueError(f"need workers >= 1, d >= 0 and 2 <= b <= 32, got {workers}, {d}, {b}")


def paper_bits_per_round(scheme: str, workers: int, d: int, b: int) -> int:
    """The paper's bit count of one round of scheme ``(a)``, ``(b)`` or ``(c)``, all workers."""
    _check(scheme, workers, d, b)
    m = workers
    if scheme == "a":
        return m * (m - 1) * (b * d + 32)
    if scheme == "b":
        return m * (64 + b * d + (b + math.ceil(math.log2(m))) * d)
    return m * (64 + 2 * b * d)


def fp32_bits_per_round(workers: int, d: int) -> int:
    """Full-precision broadcast: ``32 d M (M-1)``."""
    return 32 * d * workers * (workers - 1)


def sum_width(workers: int, b: int) -> int:
    """Bits of scheme (b)'s code sums: ``ceil(log2(2 s M + 1))``, ``s = 2^(b-1) - 1``."""
    levels = (1 << (b - 1)) - 1
    return max(1, (2 * levels * workers).bit_length())


def body_bits_per_round(scheme: str, workers: int, d: int, b: int) -> int:
    """Bits of the payload bodies this implementation sends in one round, all ranks."""
    _check(scheme, workers, d, b)
    m = workers

    def block(width: int) -> int:
        return 8 * math.ceil(width * d / 8)

    if scheme == "a":
        return m * (m - 1) * (block(b) + 32)
    down = block(sum_width(m, b)) if scheme == "b" else block(b)
    return (m - 1) * (32 + block(b) + 32 + down)
