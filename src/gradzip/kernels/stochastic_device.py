"""The stochastic-rounding quantizers' device path: encode, decode and fixed packing as torch
operations that read nothing back to the host and run on fake CUDA tensors (see
:mod:`gradzip.device`).

The same arithmetic contract as :mod:`gradzip.kernels.stochastic` (the numba kernels) and
:mod:`gradzip.kernels.stochastic_torch` (their torch twin, which reads flags on the host and
slices): one torch operation per IEEE product or sum, never ``addcmul``/``alpha=``. The
differences from the twin are the device rules only:

* no Python indexing or slicing: per-bucket values reach the elements by ``index_select``,
  padding is ``torch.cat`` and the ends are ``narrow``;
* no host reads: the twin asks ``bool(fast.any())`` whether any bucket needs the float32 or the
  float64 path; here both are computed wherever they may be needed and the bucket's path is
  chosen by ``torch.where`` [CHOICE: up to twice the arithmetic for ``s <= 127``, in exchange for
  no device-to-host synchronisation];
* every division by a constant divides by a tensor on the device, never by a Python number:
  CUDA divides by a CPU scalar as a product with its reciprocal (one more rounding), which
  would change the step ``f32(f64(c) / per)`` for ``per`` not a power of two.
"""

from __future__ import annotations

import torch

from gradzip.kernels.buckets import effective_bucket_size, num_buckets
from gradzip.kernels.dithered_torch import bucket_of_elements
from gradzip.kernels.packed import packed_bytes
from gradzip.kernels.philox import LOCAL_UNIFORM
from gradzip.kernels.philox_torch import one_plus_uniform_from_halves, philox4x32_10_torch

_F32_MAX = float(torch.finfo(torch.float32).max)
_TINY32 = 2.0**-149
_LOW16 = 0xFFFF
_LOW32 = 0xFFFFFFFF


def divided(t: torch.Tensor, k: float) -> torch.Tensor:
    """``t / k`` by a true division on ``t``'s device (``k`` as a 0-d tensor there: never a
    product with a rounded reciprocal, see the module)."""
    return t / torch.full((), k, dtype=t.dtype, device=t.device)


def per_element(values: torch.Tensor, n: int, bucket_size: int) -> torch.Tensor:
    """One value per bucket broadcast to the ``n`` elements (``index_select``)."""
    return values.index_select(0, bucket_of_elements(n, bucket_size, values.device))


def padded(t: torch.Tensor, length: int) -> torch.Tensor:
    """``t`` (1-D) followed by zeros up to ``length`` elements."""
    extra = length - t.numel()
    if extra <= 0:
        return t
    return torch.cat([t, torch.zeros(extra, dtype=t.dtype, device=t.device)])


def bucket_absmax_device(x: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """``max|x_B|`` per bucket (float32, +0.0 for a zero bucket, NaN where a bucket holds one)."""
    n = x.numel()
    bs = effective_bucket_size(n, bucket_size)
    a = x.abs()
    if bs == 0:
        return a.amax().reshape(1)
    nb = num_buckets(n, bucket_size)
    return padded(a, nb * bs).view(nb, bs).amax(dim=1)


def one_plus_uniform_device(seed: int, n: int, device: torch.device) -> torch.Tensor:
    """The ``n`` float32 ``1 + u`` of :func:`gradzip.rng.local_uniform`'s stream from element 0
    (:func:`gradzip.kernels.philox_torch.philox_one_plus_uniform_torch` without slicing)."""
    words = -(-n // 2)
    blocks = torch.arange(-(-words // 4), dtype=torch.int64, device=device)
    c = philox4x32_10_torch(
        blocks & _LOW32,
        blocks >> 32,
        torch.full_like(blocks, LOCAL_UNIFORM),
        torch.zeros_like(blocks),
        seed & _LOW32,
        seed >> 32,
    )
    flat = torch.stack(c, dim=1).reshape(-1)
    halves = torch.stack((flat & _LOW16, flat >> 16), dim=1).reshape(-1)
    return one_plus_uniform_from_halves(halves.narrow(0, 0, n))


def symmetric_divisors_device(scales: torch.Tensor, per: int) -> torch.Tensor:
    """Encoder divisor per bucket: ``f32(f64(c)/per)``, or the smallest subnormal where that
    underflows for ``c > 0``, or 1 for ``c == 0`` (float32)."""
    step = divided(scales.to(torch.float64), float(per)).to(torch.float32)
    tiny = torch.full_like(step, _TINY32)
    return torch.where(step > 0, step, torch.where(scales > 0, tiny, torch.ones_like(step)))


def safe_steps_device(scales: torch.Tensor, s: int) -> torch.Tensor:
    """The decoder's multipliers of :func:`gradzip.compressors._scaled_stochastic.safe_steps`:
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
    ones = one_plus_uniform_device(seed, n, dev)
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
        v = v + torch.full((), float(s - 1), dtype=torch.float32, device=dev)
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
    u = one_plus_uniform_device(seed, n, dev) - 1.0  # exact
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


def pack_bits_device(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`gradzip.codecs.bitpack.pack_bits`'s bytes (LSB-first) of ``symbols`` (``bits <=
    32``), in groups of 8 symbols that fill ``bits`` bytes (no slicing)."""
    n = symbols.numel()
    groups = -(-n // 8)
    s = padded(symbols.to(torch.int64) & ((1 << bits) - 1), groups * 8).view(groups, 8)
    columns: list[torch.Tensor | None] = [None] * bits
    for j in range(8):
        symbol = s.select(1, j)
        first = j * bits
        for byte in range(first // 8, (first + bits - 1) // 8 + 1):
            shift = first - 8 * byte  # position of the symbol's bit 0 within this byte
            part = (symbol << shift) if shift >= 0 else (symbol >> -shift)
            part = part & 0xFF
            column = columns[byte]
            columns[byte] = part if column is None else column | part
    out = torch.stack([c for c in columns if c is not None], dim=1).to(torch.uint8)
    return out.reshape(-1).narrow(0, 0, packed_bytes(n, bits))


def unpack_bits_device(data: torch.Tensor, n: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``n`` symbols (int64) of a packed stream of exactly :func:`packed_bytes` bytes, and a
    0-d flag: whether its padding bits are zero (as :func:`gradzip.kernels.packed.check_packed`
    requires)."""
    groups = -(-n // 8)
    raw = padded(data.to(torch.int64), groups * bits).view(groups, bits)
    symbols = []
    for j in range(8):
        first = j * bits
        value: torch.Tensor | None = None
        for byte in range(first // 8, (first + bits - 1) // 8 + 1):
            shift = first - 8 * byte
            column = raw.select(1, byte)
            part = (column >> shift) if shift >= 0 else (column << -shift)
            value = part if value is None else value | part
        assert value is not None
        symbols.append(value & ((1 << bits) - 1))
    out = torch.stack(symbols, dim=1).reshape(-1).narrow(0, 0, n)
    tail_bits = (n * bits) % 8
    if tail_bits:
        last = data.narrow(0, data.numel() - 1, 1).to(torch.int64)
        clean = ((last >> tail_bits) == 0).all()
    else:
        clean = torch.ones((), dtype=torch.bool, device=data.device)
    return out, clean
