"""The stochastic-rounding quantizers' device path: encode, decode and fixed packing as torch
operations that read nothing back to the host and run on fake CUDA tensors (see
:mod:`gradzip.device`).

The same arithmetic contract as :mod:`gradzip.kernels.stochastic` (the numba kernels) and
:mod:`gradzip.kernels.stochastic_torch` (their torch twin, which reads flags on the host and
slices): one torch operation per IEEE product or sum, never ``addcmul``/``alpha=``. The
differences from the twin are the device rules only:

* no Python indexing or slicing: per-bucket values reach the elements by ``index_select``
  (:mod:`gradzip.kernels.device_buckets`, shared with the dithered quantizers), and the fixed
  packing is :mod:`gradzip.kernels.bitpack_device`'s;
* no host reads: the twin asks ``bool(fast.any())`` whether any bucket needs the float32 or the
  float64 path; here both are computed wherever they may be needed and the bucket's path is
  chosen by ``torch.where`` [CHOICE: up to twice the arithmetic for ``s <= 127``, in exchange for
  no device-to-host synchronisation];
* every division by a constant divides by a tensor on the device, never by a Python number:
  CUDA divides by a CPU scalar as a product with its reciprocal (one more rounding), which
  would change the step ``f32(f64(c) / per)`` for ``per`` not a power of two
  (:mod:`gradzip.kernels.device_division`).
"""

from __future__ import annotations

import torch

from gradzip.kernels.device_buckets import per_element
from gradzip.kernels.device_division import device_scalar, divided
from gradzip.kernels.philox import LOCAL_UNIFORM
from gradzip.kernels.philox_torch import one_plus_uniform_device

_F32_MAX = float(torch.finfo(torch.float32).max)
_TINY32 = 2.0**-149


def symmetric_divisors_device(scales: torch.Tensor, per: int) -> torch.Tensor:
    """Encoder divisor per bucket: ``f32(f64(c)/per)``, or the smallest subnormal where that
    underflows for ``c > 0``, or 1 for ``c == 0`` (float32)."""
    step = divided(scales.to(torch.float64), float(per)).to(torch.float32)
    tiny = torch.full_like(step, _TINY32)
    return torch.where(step > 0, step, torch.where(scales > 0, tiny, torch.ones_like(step)))


def safe_steps_device(scales: torch.Tensor, s: int) -> torch.Tensor:
    """The decoder's multipliers of :func:`gradzip.compressors._scaled_stochastic.decoder_steps`:
    ``f32(f64(scale) / s)``."""
    return divided(scales.to(torch.float64), float(s)).to(torch.float32)


def symmetric_symbols_device(
    x: torch.Tensor,
    scales: torch.Tensor,
    bucket_size: int,
    per: int,
    s: int,
    clip: bool,
    seed: int,
) -> torch.Tensor:
    """The symbols (int64) of :func:`gradzip.kernels.stochastic.encode_symmetric`: the float32
    path for buckets with ``s <= 127`` and ``f <= f32 max``, else the float64 path."""
    n, dev = x.numel(), x.device
    f = 1.0 / symmetric_divisors_device(scales, per).to(torch.float64)  # per bucket, exact div
    ones = one_plus_uniform_device(seed, LOCAL_UNIFORM, n, dev)
    top = 2 * s
    w = ones.to(torch.float64) + float(s - 1)
    w = w + x.to(torch.float64) * per_element(f, n, bucket_size)
    wide = w.floor().clamp(0, top).to(torch.int64)
    if s > 127:
        return wide
    fast = f <= _F32_MAX
    f32 = per_element(torch.where(fast, f, 0.0).to(torch.float32), n, bucket_size)
    v = ones + x * f32
    if clip:
        v = v.clamp(1 - s, 1 + s)
    if s != 1:
        v = v + device_scalar(float(s - 1), v)
    narrow = v.to(torch.int64).clamp(0, top)
    return torch.where(per_element(fast, n, bucket_size), narrow, wide)


def symmetric_values_device(
    symbols: torch.Tensor, mults: torch.Tensor, bucket_size: int, s: int
) -> torch.Tensor:
    """``f32(symbol - s) * mult`` per element (float32)."""
    levels = (symbols.to(torch.int64) - s).to(torch.float32)
    return levels * per_element(mults.to(torch.float32), symbols.numel(), bucket_size)


def twos_symbols_device(
    x: torch.Tensor, steps: torch.Tensor, bucket_size: int, bits: int, seed: int
) -> torch.Tensor:
    """The symbols (int64) of :func:`gradzip.kernels.stochastic.encode_twos`: float32 for
    ``bits <= 8``, else float64; a zero step divides by 1."""
    n, dev = x.numel(), x.device
    steps = steps.to(torch.float32)
    d = per_element(torch.where(steps > 0, steps, torch.ones_like(steps)), n, bucket_size)
    u = one_plus_uniform_device(seed, LOCAL_UNIFORM, n, dev) - 1.0  # exact
    work = torch.float64 if bits > 8 else torch.float32
    k = x.to(work) / d.to(work)
    k = k + u.to(work)
    k = k.floor().clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    codes: torch.Tensor = k.to(torch.int64) & (2**bits - 1)
    return codes


def twos_values_device(
    symbols: torch.Tensor, steps: torch.Tensor, bucket_size: int, bits: int
) -> torch.Tensor:
    """``f32(k) * step`` with ``k`` the sign-extended ``bits``-bit code of each symbol."""
    k = symbols.to(torch.int64)
    k = torch.where(k >= 2 ** (bits - 1), k - 2**bits, k)
    return k.to(torch.float32) * per_element(steps.to(torch.float32), k.numel(), bucket_size)
