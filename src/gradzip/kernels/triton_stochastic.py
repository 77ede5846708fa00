"""Triton kernels of the symmetric stochastic-rounding quantizers (QSGD, TernGrad, Hou, LPC):
the fused encode (local uniforms, rounding, symbols and packing) and the decode (unpack and
rescale, or add into).

Which function replaces which torch-ops path (the device codecs launch these kernels through
:mod:`gradzip.kernels.triton_device`, which reads nothing back):

* :func:`triton_symmetric_encode` ``(x, scales, bucket_size, per, s, clip, seed, bits)``
  returns ``(symbols, packed)`` on ``x``'s device: ``symbols`` equals
  ``symmetric_symbols_torch(x, scales, bucket_size, per, s, clip, seed)``
  (:mod:`gradzip.kernels.stochastic_torch`; ``uint8`` for ``2s <= 255``, else ``int32``) and
  ``packed`` equals ``pack_bits_torch(symbols, bits)`` (empty for ``bits`` 0); both equal the
  last two results of :func:`gradzip.kernels.stochastic.fused_symmetric_encode` with the same
  arguments. ``scales``: float32, one per bucket, always given
  (:func:`gradzip.kernels.stochastic_torch.bucket_absmax_torch` computes them on the device).
* :func:`triton_symmetric_decode` ``(data, n, bits, mults, bucket_size, s, what, out=None,
  add=True)`` has the signature and the result of
  :func:`gradzip.kernels.stochastic.fused_symmetric_decode` (the torch-ops path:
  ``symmetric_values_torch(unpack_bits_torch(data, n, bits), mults, bucket_size, s)``, plus
  ``out`` for the add-into variant, ``out[i] + v`` in one float32 add after the alphabet check).

Arithmetic: exactly :mod:`gradzip.kernels.stochastic`'s contract (its module docstring), every
product and sum its own IEEE operation in the same order [CHOICE]: launched with
``enable_fp_fusion=False`` so that ``o + x*f`` is never contracted into a fused multiply-add.
The per-bucket factor ``f = 1 / f64(divisor)`` is computed with torch in float64
(:func:`gradzip.kernels.stochastic_torch.symmetric_divisors`, the same divisions) and gathered
per element. The uniforms are the local stream (:data:`gradzip.kernels.philox.LOCAL_UNIFORM`) of
:mod:`gradzip.kernels.triton_philox`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import triton
import triton.language as tl

from gradzip.kernels.packed import check_packed, packed_bytes
from gradzip.kernels.philox import LOCAL_UNIFORM
from gradzip.kernels.stochastic_torch import symmetric_divisors
from gradzip.kernels.triton_bitpack import max_of, pack_store, unpack_load
from gradzip.kernels.triton_dispatch import require_triton
from gradzip.kernels.triton_launch import (
    BLOCK,
    checked_decode,
    decode_target,
    flat_float32,
    launch_args,
    program_tops,
    programs,
)
from gradzip.kernels.triton_philox import uniform_run

# globals read inside @triton.jit functions must be constexpr (compiled mode rejects others)
_F32_MAX = tl.constexpr(float(np.finfo(np.float32).max))
_LOCAL = tl.constexpr(LOCAL_UNIFORM)


@triton.jit
def _symmetric_encode_kernel(  # type: ignore[no-untyped-def]
    x_ptr, fac_ptr, sym_ptr, packed_ptr, n, nbytes, bucket_size, k0, k1,
    S: tl.constexpr, CLIP: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Symbols of :func:`gradzip.kernels.stochastic.encode_symmetric` for elements
    ``pid*BLOCK ..`` into ``sym_ptr``, and packed when ``BITS > 0``. ``fac_ptr``: ``f = 1 /
    f64(d)`` per bucket (float64); ``bucket_size``: at least 1 (``n`` for one bucket)."""
    pid = tl.program_id(0).to(tl.int64)
    i = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask, other=0.0)
    f = tl.load(fac_ptr + i // bucket_size, mask=mask, other=1.0)
    o = uniform_run(pid * BLOCK, k0, k1, _LOCAL, BLOCK)
    # float64 path: w = (f64(o) + (s - 1)) + f64(x)*f, clamp(floor(w), 0, 2s)
    w = o.to(tl.float64) + (S - 1.0)
    w = w + x.to(tl.float64) * f
    q = tl.minimum(tl.maximum(tl.floor(w), 0.0), 2.0 * S).to(tl.int32)
    if S <= 127:  # float32 path where f fits float32 (decided per bucket)
        fast = f <= _F32_MAX
        f32 = tl.where(fast, f, 0.0).to(tl.float32)
        v = o + x * f32
        if CLIP:
            v = tl.where(v < 1.0 - S, 1.0 - S, v)  # max(v, 1 - s)
            v = tl.where(v > 1.0 + S, 1.0 + S, v)  # min(v, 1 + s)
            v = v + (S - 1.0)
        elif S != 1:
            v = v + (S - 1.0)
        t = tl.minimum(tl.maximum(v.to(tl.int32), 0), 2 * S)  # truncation, then clamp
        q = tl.where(fast, t, q)
    q = tl.where(mask, q, 0)  # zero padding symbols: zero padding bits
    if 2 * S <= 255:
        tl.store(sym_ptr + i, q.to(tl.uint8), mask=mask)
    else:
        tl.store(sym_ptr + i, q, mask=mask)
    if BITS > 0:
        pack_store(q, packed_ptr, pid * BLOCK, nbytes, BLOCK, BITS)


def triton_symmetric_encode(
    x: torch.Tensor,
    scales: torch.Tensor,
    bucket_size: int,
    per: int,
    s: int,
    clip: bool,
    seed: int,
    bits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(symbols, packed)`` of float32 ``x`` on the symmetric grid, on ``x``'s device (the
    module docstring). ``bits`` 0: symbols only (``packed`` is empty)."""
    require_triton(x)
    n, dev = x.numel(), x.device
    symbols = torch.empty(n, dtype=torch.uint8 if 2 * s <= 255 else torch.int32, device=dev)
    nbytes = packed_bytes(n, bits) if bits else 0
    packed = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if n == 0:
        return symbols, packed
    fac = 1.0 / symmetric_divisors(scales.to(dev), per).to(torch.float64)
    symmetric_encode_into(x, fac, bucket_size, s, clip, seed, bits, symbols, packed)
    return symbols, packed


def symmetric_encode_into(
    x: torch.Tensor,
    fac: torch.Tensor,
    bucket_size: int,
    s: int,
    clip: bool,
    seed: int,
    bits: int,
    symbols: torch.Tensor,
    packed: torch.Tensor,
) -> None:
    """One launch of the symmetric encode over the ``n > 0`` elements of ``x``: the symbols
    into ``symbols`` and, for ``bits > 0``, packed into ``packed``. ``fac``: ``1 / f64(d)`` per
    bucket (float64), divided as the caller's rules say."""
    n = x.numel()
    div, k0, k1 = launch_args(n, bucket_size, seed)
    _symmetric_encode_kernel[(programs(n),)](
        flat_float32(x), fac.contiguous(), symbols, packed, n, packed.numel(), div, k0, k1,
        S=s, CLIP=bool(clip), BITS=bits, BLOCK=BLOCK, enable_fp_fusion=False,
    )  # fmt: skip


@triton.jit
def _symmetric_decode_kernel(  # type: ignore[no-untyped-def]
    packed_ptr, mults_ptr, out_ptr, tops_ptr, n, nbytes, bucket_size, s,
    WRITE: tl.constexpr, ADD: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """:func:`gradzip.kernels.stochastic.decode_symmetric` for elements ``pid*BLOCK ..``:
    ``(f32(symbol) - f32(s)) * mult`` (both exact below ``2**24``, so is their difference),
    written, or added to ``out`` (``ADD``), when ``WRITE``; ``tops_ptr[pid]``: the program's
    largest symbol."""
    pid = tl.program_id(0).to(tl.int64)
    i = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = i < n
    sym = unpack_load(packed_ptr, i, mask, nbytes, BITS)
    tl.store(tops_ptr + pid + tl.arange(0, 1), max_of(sym, BLOCK))
    if WRITE:
        mult = tl.load(mults_ptr + i // bucket_size, mask=mask, other=0.0)
        val = (sym.to(tl.float32) - tl.cast(s, tl.float32)) * mult
        if ADD:
            val = tl.load(out_ptr + i, mask=mask, other=0.0) + val
        tl.store(out_ptr + i, val, mask=mask)


def triton_symmetric_decode(
    data: torch.Tensor,
    n: int,
    bits: int,
    mults: torch.Tensor,
    bucket_size: int,
    s: int,
    what: str,
    out: torch.Tensor | None = None,
    add: bool = True,
) -> torch.Tensor:
    """:func:`gradzip.kernels.stochastic.fused_symmetric_decode` on ``data``'s device: float32
    values, or ``out`` with the values added into it (``add``) or written into it."""
    require_triton(data)
    check_packed(data, n, bits)
    dev = data.device
    target = decode_target(out, n, dev)
    if n == 0:
        return target if out is None else out
    tops = program_tops(n, dev)
    launch = symmetric_decode_launcher(data, n, bits, mults, bucket_size, s, target, tops)
    checked_decode(launch, tops, 2 * s + 1, what, out is not None and add)
    return target if out is None else out


def symmetric_decode_launcher(
    data: torch.Tensor,
    n: int,
    bits: int,
    mults: torch.Tensor,
    bucket_size: int,
    s: int,
    target: torch.Tensor,
    tops: torch.Tensor,
) -> Callable[[bool, bool], None]:
    """``launch(write, add)``: one run of the symmetric decode kernel over the ``n > 0``
    symbols of ``data`` into ``target`` (float32, flat), each program's largest symbol into
    ``tops`` (:func:`~gradzip.kernels.triton_launch.program_tops`)."""
    div, _, _ = launch_args(n, bucket_size, 0)
    raw = data.contiguous()
    m = mults.to(device=data.device, dtype=torch.float32).contiguous()
    common = (raw, m, target, tops, n, raw.numel(), div, s)

    def launch(write: bool, add: bool) -> None:
        _symmetric_decode_kernel[(programs(n),)](
            *common, WRITE=write, ADD=add, BITS=bits, BLOCK=BLOCK, enable_fp_fusion=False
        )

    return launch
