"""The Triton kernels launched for the device path (:mod:`gradzip.device`): nothing read back.

The public wrappers of :mod:`gradzip.kernels.triton_dithered`, ``triton_stochastic`` and
``triton_signs`` (and ``triton_crc32``, called through :func:`crc32_register`) serve the host-facing API: they raise on a corrupt stream, so they read the
alphabet check (``int(tops.max())``), the padding bits and, for the symmetric encode, divide
by a Python number (which CUDA turns into a product with a rounded reciprocal). The device
codecs need the same kernels with a 0-d validity *flag* instead of an exception and every
division by a device scalar, so this module launches the kernels itself, where the wrappers
differ, and calls the wrappers where they already read nothing (the dithered encode, the
sign packing, the residual). Grid sizes come from ``numel`` and shapes only: a launch reads no
value of any tensor.

[CHOICE] The kernel modules are looked up in ``sys.modules`` on every call
(:func:`_module`), not imported at this module's top: importing them imports Triton (slow, and
optional), and the tests swap in copies defined under the interpreter
(``TRITON_INTERPRET=1``, see ``tests/kernels/triton_modes.py``) without reloading this module.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from gradzip.kernels.device_division import divided
from gradzip.kernels.packed import packed_bytes, symbol_bits
from gradzip.kernels.stochastic_device import symmetric_divisors_device
from gradzip.kernels.triton_dispatch import triton_available
from gradzip.kernels.triton_launch import BLOCK, program_tops, programs


def use_triton(t: torch.Tensor) -> bool:
    """Whether the device path runs ``t`` through the Triton kernels: :func:`triton_available`
    (a CUDA tensor, or a CPU tensor under ``forced_triton()`` with ``TRITON_INTERPRET=1``),
    and ``t`` holds real values. [CHOICE] A fake tensor (``FakeTensorMode``: the tests' CUDA
    tensors on a CPU build) takes the torch-ops path, since a kernel cannot be launched on
    memory that does not exist; that path is the reference whose host-read freedom the fake
    CUDA tests check."""
    from torch._subclasses.fake_tensor import is_fake

    return triton_available(t) and not is_fake(t)


def _module(name: str) -> ModuleType:
    """The kernel module ``gradzip.kernels.<name>`` as currently registered (see above)."""
    return importlib.import_module(f"gradzip.kernels.{name}")


def _flag(value: bool, device: torch.device) -> torch.Tensor:
    return torch.full((), value, dtype=torch.bool, device=device)


def _tail_clear(data: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """0-d flag: the padding bits past ``n*bits`` in the last byte of the stream are zero."""
    tail = (n * bits) % 8
    if not tail or data.numel() == 0:
        return _flag(True, data.device)
    last = data.narrow(0, data.numel() - 1, 1).to(torch.int64)
    return ((last >> tail) == 0).all()


def _within(tops: torch.Tensor, alphabet: int) -> torch.Tensor:
    """0-d flag: every program's largest symbol lies below ``alphabet``."""
    if tops.numel() == 0:
        return _flag(True, tops.device)
    return tops.amax() < alphabet


# -- dithered quantizers (DQSG, NDQSG, half dithering) ---------------------------------------
def dithered_packed(
    x: torch.Tensor, scales: torch.Tensor, bucket_size: int, args: dict[str, object], bits: int
) -> torch.Tensor:
    """The packed symbols of :func:`gradzip.kernels.dithered_device.encode_symbols_device`
    ``(x, scales, bucket_size, **args)`` in one launch (the wrapper reads nothing: the bucket
    factors are a division by device tensors, the constants a tensor built from host floats)."""
    return _module("triton_dithered").triton_dithered_encode(  # type: ignore[no-any-return]
        x, scales, bucket_size, bits=bits, **args
    )


def dithered_values(
    packed: torch.Tensor,
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gradzip.kernels.dithered_device.decode_affine_device` of the packed stream (of
    exactly :func:`packed_bytes` bytes) and the flag: padding bits zero, every symbol in the
    alphabet. The step ``f64(sigma) / divisor`` divides by a device scalar."""
    td = _module("triton_dithered")
    dev = packed.device
    bits = symbol_bits(alphabet)
    out = torch.empty(n, dtype=torch.float32, device=dev)
    tops = program_tops(n, dev)
    if n:
        s32 = scales.to(torch.float32)
        steps = divided(s32.to(torch.float64), divisor)
        td.affine_decode_launcher(
            packed, n, bits, s32, steps, bucket_size, c, dithered, seed, stream, wide, out, tops
        )(True, False)
    return out, _tail_clear(packed, n, bits) & _within(tops, alphabet)


# -- symmetric stochastic rounding (QSGD, TernGrad, LPC) -------------------------------------
def symmetric_encoded(
    x: torch.Tensor,
    scales: torch.Tensor,
    bucket_size: int,
    per: int,
    s: int,
    clip: bool,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(symbols, packed)`` of :func:`gradzip.kernels.stochastic_device.symmetric_symbols_device`
    in one launch: symbols ``uint8`` for ``2s <= 255``, else ``int32``; packed fixed-width. The
    factor ``1 / f64(divisor)`` takes the device twin's divisors (a division by a device
    scalar), not the wrapper's ``tensor / per``."""
    ts = _module("triton_stochastic")
    n, dev = x.numel(), x.device
    bits = symbol_bits(2 * s + 1)
    symbols = torch.empty(n, dtype=torch.uint8 if 2 * s <= 255 else torch.int32, device=dev)
    nbytes = packed_bytes(n, bits)
    packed = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if n:
        fac = 1.0 / symmetric_divisors_device(scales, per).to(torch.float64)
        ts.symmetric_encode_into(x, fac, bucket_size, s, clip, seed, bits, symbols, packed)
    return symbols, packed


def symmetric_values(
    packed: torch.Tensor, n: int, mults: torch.Tensor, s: int, bucket_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``f32(symbol - s) * mult`` of the packed stream and the flag: padding bits zero and every
    symbol in ``[0, 2s]`` (:func:`gradzip.compressors._device_stochastic.symmetric_device_values`)."""
    ts = _module("triton_stochastic")
    dev = packed.device
    bits = symbol_bits(2 * s + 1)
    out = torch.empty(n, dtype=torch.float32, device=dev)
    tops = program_tops(n, dev)
    if n:
        ts.symmetric_decode_launcher(packed, n, bits, mults, bucket_size, s, out, tops)(True, False)
    return out, _tail_clear(packed, n, bits) & _within(tops, 2 * s + 1)


# -- one-bit signs ---------------------------------------------------------------------------
def signs_packed(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed, counts, sums)`` of :func:`gradzip.kernels.onebit_device.pack_signs_device`
    (the wrapper reads nothing; its combining tree slices, which a real device allows)."""
    return _module("triton_signs").triton_pack_signs(m)  # type: ignore[no-any-return]


def signs_expanded(
    packed: torch.Tensor, means: torch.Tensor, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gradzip.kernels.onebit_device.expand_signs_device`: ``(cols, rows)`` float32
    ``mu+``/``mu-`` by the bits and the flag (every padding bit zero, checked on the device)."""
    ts = _module("triton_signs")
    cols, width = packed.shape
    dev = packed.device
    out = torch.empty((cols, rows), dtype=torch.float32, device=dev)
    if cols and rows:
        ts._expand_kernel[(programs(rows), cols)](
            packed.contiguous(), means.to(torch.float32).contiguous(), out, rows, width // 4,
            ADD=False, BLOCK=BLOCK, enable_fp_fusion=False,
        )  # fmt: skip
    tail = rows % 32
    if tail == 0 or packed.numel() == 0:
        return out, _flag(True, dev)
    last = packed.narrow(1, 4 * (rows // 32), 4).to(torch.int64)
    shifts = 8 * torch.arange(4, dtype=torch.int64, device=dev)
    word = (last << shifts).sum(dim=1)  # disjoint bytes: an exact integer sum
    return out, ((word >> tail) == 0).all()


def crc32_register(
    data: torch.Tensor, leaf: torch.Tensor, shifts: torch.Tensor, finish: int
) -> torch.Tensor:
    """zlib's CRC-32 of the ``uint8`` ``data`` as a 0-d int64 tensor on its device, one kernel
    (:func:`gradzip.kernels.triton_crc32.triton_crc32`; the tables and ``finish`` as there)."""
    return _module("triton_crc32").triton_crc32(data, leaf, shifts, finish)  # type: ignore[no-any-return]


def signs_residual(
    m: torch.Tensor, means: torch.Tensor, keep: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(m - V_hat, V_hat if keep)`` out of place (``V_hat``: ``mu+`` where ``m >= 0``, else
    ``mu-``), by the residual kernel on a contiguous copy of ``m`` (``m`` is left alone: the
    caller selects on its finiteness flag)."""
    residual = m.to(torch.float32).clone(memory_format=torch.contiguous_format)
    v_hat = _module("triton_signs").triton_subtract_reconstruction(residual, means, keep)
    return residual, v_hat
