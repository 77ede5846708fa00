"""The host-side setup the Triton kernels of the quantizers share: the block size, the grid,
the bucket divisor and Philox key, the decode target's checks and the alphabet check.

Plain Python and torch, no ``@triton.jit`` [CHOICE]: importing it imports neither Triton nor a
kernel, so :mod:`gradzip.kernels.triton_device` uses it without paying for Triton, and the
tests' interpreted copies of the kernel modules (``tests/kernels/triton_modes.py``) need not
reload it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gradzip.errors import CorruptPayloadError
from gradzip.kernels.buckets import effective_bucket_size

#: elements per program [CHOICE]: 1024, a multiple of 8 (whole bytes of the packed stream per
#: program) and of the 128 Philox blocks four warps generate side by side
BLOCK = 1024


def programs(n: int) -> int:
    """The number of programs (blocks of :data:`BLOCK` elements) covering ``n`` elements."""
    return -(-n // BLOCK)


def program_tops(n: int, device: torch.device) -> torch.Tensor:
    """Zeroed int64 slots, one per program, for each program's largest decoded symbol."""
    return torch.zeros(programs(n), dtype=torch.int64, device=device)


def philox_key(seed: int) -> tuple[int, int]:
    """``(k0, k1)``: the low and high 32-bit words of a 64-bit seed, the Philox key."""
    return seed & 0xFFFFFFFF, seed >> 32


def launch_args(n: int, bucket_size: int, seed: int) -> tuple[int, int, int]:
    """``(bucket divisor, k0, k1)``: the bucket size the kernels divide by (``n`` for one
    bucket, so every index gives bucket 0) and the Philox key."""
    bs = effective_bucket_size(n, bucket_size)
    return (bs if bs > 0 else max(n, 1)), *philox_key(seed)


def flat_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the contiguous 1-D float32 tensor a kernel reads."""
    return x.to(torch.float32).contiguous().view(-1)


def decode_target(out: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
    """The flat float32 tensor a decode writes: a fresh one, or ``out`` (checked: float32,
    ``n`` elements on ``device``, contiguous) viewed flat."""
    if out is None:
        return torch.empty(n, dtype=torch.float32, device=device)
    if out.dtype != torch.float32 or out.device != device or out.numel() != n:
        raise ValueError(f"a decode adds only into a float32 tensor of {n} elements on {device}")
    if not out.is_contiguous():
        raise ValueError("a decode adds only into a contiguous tensor")
    return out.view(-1)


def raise_if_outside(tops: torch.Tensor, alphabet: int, what: str) -> None:
    """:class:`CorruptPayloadError` if a program's largest symbol is ``>= alphabet``."""
    if tops.numel() and int(tops.max()) >= alphabet:
        raise CorruptPayloadError(
            f"{what} payload holds a symbol outside the alphabet [0, {alphabet})"
        )


def checked_decode(
    launch: Callable[[bool, bool], None],
    tops: torch.Tensor,
    alphabet: int,
    what: str,
    accumulate: bool,
) -> None:
    """Run a decode kernel (``launch(write, add)``, which fills ``tops``) and check the
    alphabet; when adding into a tensor (``accumulate``), a first pass that writes nothing
    checks the whole stream before anything is added, so a corrupt one leaves it untouched."""
    if accumulate:
        launch(False, False)
        raise_if_outside(tops, alphabet, what)
    launch(True, accumulate)
    raise_if_outside(tops, alphabet, what)
