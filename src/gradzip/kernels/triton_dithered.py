"""Triton kernels of the dithered quantizers (DQSG, NDQSG, half dithering): the fused encode
(dither, quantize, pack) and the affine decode (unpack, dither, reconstruct; or add into).

Which function replaces which torch-ops path (the device codecs launch these kernels through
:mod:`gradzip.kernels.triton_device`, which reads nothing back):

* :func:`triton_dithered_encode` ``(x, scales, bucket_size, numer, seed, stream, nsum, c, top,
  modk, fast_ok, bits)`` returns the ``uint8`` packed symbols on ``x``'s device; it equals
  ``pack_bits_torch(encode_symbols_device(x, scales, bucket_size, numer, seed, stream, nsum, c,
  top, modk, fast_ok), bits)`` (:mod:`gradzip.kernels.dithered_device`,
  :mod:`gradzip.kernels.bitpack_torch`) and the packed part of
  :func:`gradzip.kernels.dithered.fused_encode` with the same arguments. ``scales``: float32,
  one per bucket (:func:`gradzip.kernels.stochastic_torch.bucket_absmax_torch`).
* :func:`triton_decode_affine` ``(data, n, alphabet, scales, bucket_size, divisor, c, dithered,
  seed, stream, wide, what, out=None, add=True)`` has the signature and the result of
  :func:`gradzip.kernels.dithered.fused_decode_affine` (the torch-ops path:
  ``decode_affine_device(unpack_bits_torch(data, n, bits), scales, ...)``), on ``data``'s
  device; with ``out`` the values are added into it (``out[i] + v``, one float32 add) after the
  alphabet was checked, so a corrupt stream raises with ``out`` untouched.

Arithmetic: exactly :mod:`gradzip.kernels.dithered`'s contract (its module docstring). Every
product and sum is its own IEEE operation in the stated precision and order [CHOICE]: the
kernels are launched with ``enable_fp_fusion=False``, so Triton never contracts ``x*f + base``
into a fused multiply-add (which rounds once, not twice, and would change bytes). Per-bucket
quantities that involve a division (``numer / sigma``, ``sigma / divisor``) are computed once
per bucket in float64 with torch, as :mod:`gradzip.kernels.dithered_device` does, and gathered
per element. Floating-point constants travel in a float64 tensor, never as Python-float kernel
arguments (which Triton types as float32). The dither is :mod:`gradzip.kernels.triton_philox`'s.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import triton
import triton.language as tl

from gradzip.kernels.device_division import divided
from gradzip.kernels.dithered import inverse_rounded_up
from gradzip.kernels.dithered_device import bucket_factors
from gradzip.kernels.packed import check_packed, packed_bytes, symbol_bits
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
from gradzip.kernels.triton_philox import uniform_at, uniform_run

#: read inside a @triton.jit function, so a constexpr (compiled mode rejects other globals)
_F32_MAX = tl.constexpr(float(np.finfo(np.float32).max))


@triton.jit
def _bases(i, n, k0, k1, stream, NSUM: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """The dither sums of both paths from one draw of the stream: the float32 ``1 + u`` and its
    float64 value (``NSUM`` 0), or the sums, left to right, of the ``u = (1 + u) - 1`` (exact in
    float32) of elements ``i, i + n, ...``: in float32, and widened then summed from 0 in
    float64."""
    if NSUM == 0:
        base = uniform_run(tl.program_id(0).to(tl.int64) * BLOCK, k0, k1, stream, BLOCK)
        wide = base.to(tl.float64)
    else:
        base = tl.full((BLOCK,), 0.0, tl.float32)
        wide = tl.full((BLOCK,), 0.0, tl.float64)
        for j in tl.static_range(NSUM):
            if ALIGNED:
                first = tl.program_id(0).to(tl.int64) * BLOCK + tl.cast(n, tl.int64) * j
                o = uniform_run(first, k0, k1, stream, BLOCK)
            else:
                o = uniform_at(i + tl.cast(n, tl.int64) * j, k0, k1, stream)
            base = o - 1.0 if j == 0 else base + (o - 1.0)
            wide = wide + (o - 1.0).to(tl.float64)
    return base, wide


@triton.jit
def _encode_kernel(  # type: ignore[no-untyped-def]
    x_ptr, fac_ptr, consts_ptr, packed_ptr, n, nbytes, bucket_size, k0, k1, stream, top, modk,
    NSUM: tl.constexpr, ALIGNED: tl.constexpr, FAST_OK: tl.constexpr, MOD: tl.constexpr,
    BITS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Symbols of :func:`gradzip.kernels.dithered.encode_tiles` for elements ``pid*BLOCK ..``,
    packed. ``fac_ptr``: ``numer / sigma`` per bucket (float64, 0 for a zero bucket);
    ``consts_ptr``: ``[c, inv_k32]`` (float64); ``bucket_size``: at least 1 (``n`` for one
    bucket)."""
    pid = tl.program_id(0).to(tl.int64)
    i = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask, other=0.0)
    f = tl.load(fac_ptr + i // bucket_size, mask=mask, other=0.0)
    c = tl.load(consts_ptr)
    topf = tl.cast(top, tl.float32)
    # float64 path (every bucket whose factor does not fit float32, or all without FAST_OK)
    base, w = _bases(i, n, k0, k1, stream, NSUM, ALIGNED, BLOCK)
    w = w + c
    w = w + x.to(tl.float64) * f
    w = tl.minimum(tl.maximum(tl.floor(w), 0.0), topf.to(tl.float64))
    q = w.to(tl.int32)
    if MOD:
        q = q % tl.cast(modk, tl.int32)
    if FAST_OK:
        fast = f <= _F32_MAX
        f32 = tl.where(fast, f, 0.0).to(tl.float32)  # round to nearest, as np.float32(f)
        v = base + x * f32
        v = v + c.to(tl.float32)
        v = tl.where(v < topf, v, topf)
        if MOD:  # float32 remainder of _quantize_fast_mod: floor(q * (1/k rounded up)) is q // k
            k32 = tl.cast(modk, tl.float32)
            inv_k32 = tl.load(consts_ptr + 1).to(tl.float32)
            v = tl.floor(v)
            v = v - tl.floor(v * inv_k32) * k32
        q = tl.where(fast, v.to(tl.int32), q)  # truncation toward zero, as np.int32(v)
    q = tl.where(mask, q, 0)  # zero padding symbols: zero padding bits
    pack_store(q, packed_ptr, pid * BLOCK, nbytes, BLOCK, BITS)


def triton_dithered_encode(
    x: torch.Tensor,
    scales: torch.Tensor,
    bucket_size: int,
    numer: float,
    seed: int,
    stream: int,
    nsum: int,
    c: float,
    top: int,
    modk: int,
    fast_ok: bool,
    bits: int,
) -> torch.Tensor:
    """The ``bits``-bit packed symbols (``uint8``, on ``x``'s device) of float32 ``x`` under the
    per-bucket float32 ``scales``: the packed part of
    :func:`gradzip.kernels.dithered.fused_encode` (same arguments; the module docstring)."""
    require_triton(x)
    n, dev = x.numel(), x.device
    nbytes = packed_bytes(n, bits)
    packed = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if n == 0:
        return packed
    div, k0, k1 = launch_args(n, bucket_size, seed)
    fac = bucket_factors(float(numer), scales.to(dev)).contiguous()
    inv_k = inverse_rounded_up(modk) if modk > 0 else 0.0
    consts = torch.tensor([float(c), inv_k], dtype=torch.float64, device=dev)
    _encode_kernel[(programs(n),)](
        flat_float32(x), fac, consts, packed, n, nbytes, div, k0, k1,
        stream, top, max(modk, 1), NSUM=nsum, ALIGNED=nsum <= 1 or n % 8 == 0,
        FAST_OK=bool(fast_ok), MOD=modk > 0, BITS=bits, BLOCK=BLOCK, enable_fp_fusion=False,
    )  # fmt: skip
    return packed


@triton.jit
def _decode_affine_kernel(  # type: ignore[no-untyped-def]
    packed_ptr, scales_ptr, steps_ptr, consts_ptr, out_ptr, tops_ptr, n, nbytes, bucket_size,
    k0, k1, stream, DITHERED: tl.constexpr, WIDE: tl.constexpr, WRITE: tl.constexpr,
    ADD: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """:func:`gradzip.kernels.dithered.decode_affine_tiles` for elements ``pid*BLOCK ..``:
    ``v = ((s - (1 + u)) + c) * step`` (``step = f64(sigma) / divisor``, ``steps_ptr``, rounded
    to float32 unless ``WIDE``), +0.0 for a zero bucket; written, or added to ``out`` (``ADD``),
    when ``WRITE``. ``tops_ptr[pid]``: the program's largest symbol (the alphabet check)."""
    pid = tl.program_id(0).to(tl.int64)
    i = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = i < n
    sym = unpack_load(packed_ptr, i, mask, nbytes, BITS)
    tl.store(tops_ptr + pid + tl.arange(0, 1), max_of(sym, BLOCK))
    if WRITE:
        b = i // bucket_size
        sigma = tl.load(scales_ptr + b, mask=mask, other=0.0)
        step = tl.load(steps_ptr + b, mask=mask, other=0.0)
        c = tl.load(consts_ptr)
        if WIDE:
            v = sym.to(tl.float64)
            if DITHERED:
                v = v - uniform_run(pid * BLOCK, k0, k1, stream, BLOCK).to(tl.float64)
            v = v + c
            val = (v * step).to(tl.float32)
        else:
            v = sym.to(tl.float32)
            if DITHERED:
                v = v - uniform_run(pid * BLOCK, k0, k1, stream, BLOCK)
            v = v + c.to(tl.float32)
            val = v * step.to(tl.float32)
        val = tl.where(sigma == 0, 0.0, val)
        if ADD:
            val = tl.load(out_ptr + i, mask=mask, other=0.0) + val
        tl.store(out_ptr + i, val, mask=mask)


def triton_decode_affine(
    data: torch.Tensor,
    n: int,
    alphabet: int,
    scales: torch.Tensor,
    bucket_size: int,
    divisor: float,
    c: float,
    dithered: bool,
    seed: int,
    stream: int,
    wide: bool,
    what: str,
    out: torch.Tensor | None = None,
    add: bool = True,
) -> torch.Tensor:
    """:func:`gradzip.kernels.dithered.fused_decode_affine` on ``data``'s device: float32
    values, or ``out`` with the values added into it (``add``) or written into it."""
    require_triton(data)
    bits = symbol_bits(alphabet)
    check_packed(data, n, bits)
    dev = data.device
    target = decode_target(out, n, dev)
    if n == 0:
        return target if out is None else out
    scales = scales.to(device=dev, dtype=torch.float32).contiguous()
    # a true division on the device: CUDA multiplies by the rounded reciprocal of a Python-number
    # divisor, and the steps computed so decoded differently from numba on an H200 (2^20 symbols,
    # 2,048 buckets: 676 steps one float64 ulp off)
    steps = divided(scales.to(torch.float64), float(divisor))
    tops = program_tops(n, dev)
    launch = affine_decode_launcher(
        data, n, bits, scales, steps, bucket_size, c, dithered, seed, stream, wide, target, tops
    )
    checked_decode(launch, tops, alphabet, what, out is not None and add)
    return target if out is None else out


def affine_decode_launcher(
    data: torch.Tensor,
    n: int,
    bits: int,
    scales: torch.Tensor,
    steps: torch.Tensor,
    bucket_size: int,
    c: float,
    dithered: bool,
    seed: int,
    stream: int,
    wide: bool,
    target: torch.Tensor,
    tops: torch.Tensor,
) -> Callable[[bool, bool], None]:
    """``launch(write, add)``: one run of the affine decode kernel over the ``n > 0`` symbols
    of ``data`` into ``target`` (float32, flat), each program's largest symbol into ``tops``
    (:func:`~gradzip.kernels.triton_launch.program_tops`). ``scales``: float32 per bucket;
    ``steps``: ``f64(sigma) / divisor`` per bucket, divided as the caller's rules say (the
    wrapper by a host number, the device path by a device scalar)."""
    div, k0, k1 = launch_args(n, bucket_size, seed)
    consts = torch.tensor([float(c)], dtype=torch.float64, device=data.device)
    raw = data.contiguous()
    common = (raw, scales.to(torch.float32).contiguous(), steps.contiguous(), consts, target,
              tops, n, raw.numel(), div, k0, k1, stream)  # fmt: skip
    flags = {"DITHERED": bool(dithered), "WIDE": bool(wide), "BITS": bits, "BLOCK": BLOCK}

    def launch(write: bool, add: bool) -> None:
        _decode_affine_kernel[(programs(n),)](
            *common, WRITE=write, ADD=add, **flags, enable_fp_fusion=False
        )

    return launch
