"""Pieces shared by the scale-and-quantize compressors: buckets and their max-abs scales."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from gradzip.buffers import fresh_array
from gradzip.codecs.bitpack import packed_bytes
from gradzip.codecs.symbols import pack_symbols, packed_symbol_bits, symbol_bits, unpack_symbols
from gradzip.compressors.base import Body, body_tensor
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.kernels.dithered import fused_encode
from gradzip.payload import Deferred


def check_scales(scales: torch.Tensor, what: str) -> None:
    """Reject scales a correct sender cannot produce (negative, NaN, Inf)."""
    if not bool(torch.isfinite(scales).all()) or bool((scales < 0).any()):
        raise CorruptPayloadError(f"{what} payload holds a negative or non-finite scale")


def all_finite(scales: torch.Tensor | np.ndarray) -> bool:
    """Whether every scale is finite: for max-abs scales computed by a fused kernel, whether the
    whole input was (see :meth:`gradzip.compressors.base.Compressor._encode_scanned`)."""
    values = scales.numpy() if isinstance(scales, torch.Tensor) else scales
    return bool(np.isfinite(values).all())


def check_symbols(symbols: torch.Tensor, alphabet: int, what: str) -> None:
    """Reject symbols outside ``[0, alphabet)`` (possible in a corrupt fixed-width stream)."""
    if not symbols.numel():
        return
    lo, hi = (0, symbols.max()) if symbols.dtype == torch.uint8 else torch.aminmax(symbols)
    if int(hi) >= alphabet or int(lo) < 0:
        raise CorruptPayloadError(
            f"{what} payload holds a symbol outside the alphabet [0, {alphabet})"
        )


def clip_to_std(x: torch.Tensor, absmax: float, c: float) -> tuple[torch.Tensor, float]:
    """Clip to ``+-c*std(x)`` (DQSG's authors' code [CODE], TernGrad's 2.5 sigma); returns the
    clipped copy and its new ``max|x|``.

    Population std, as the authors' ``np.std``, computed in float64 so that values near the
    float32 limit do not overflow the variance. A constant tensor (std 0) is left alone rather
    than clipped to zero [CHOICE]. ``x`` may be the caller's tensor, so it is never modified.
    """
    std = float(x.to(torch.float64).std(correction=0)) if x.numel() > 1 else 0.0
    bound = float(np.float32(c * std))
    if not math.isfinite(bound) or bound <= 0 or bound >= absmax:
        return x, absmax
    return torch.clamp(x, -bound, bound), bound


def fresh_uint8(n: int) -> torch.Tensor:
    """An uninitialised uint8 tensor in recycled NumPy memory.

    A fresh 64 MB tensor costs more in page faults than the arithmetic that fills it; the pool
    of :mod:`gradzip.buffers` hands out large arrays that are already mapped.
    """
    return torch.from_numpy(fresh_array(n, np.uint8))


def fresh_float32(n: int) -> torch.Tensor:
    """An uninitialised float32 tensor in recycled NumPy memory (see :func:`fresh_uint8`)."""
    return torch.from_numpy(fresh_array(n, np.float32))


#: Elements per float32 scale of the max-norm quantizers (dqsg, ndqsg, half_dither, qsgd,
#: terngrad, qsgd_l2) unless ``bucket_size`` is given [CHOICE; the spec and the papers use one
#: scale per tensor, ``bucket_size=None``]. One scale per tensor makes the error of every entry
#: scale with the tensor's largest entry: on a 784-4096-4096-4096-10 MLP trained through the DDP
#: hook, dqsg (M=2), qsgd and terngrad diverged within 7 steps with it and trained with 512-entry
#: buckets, for 32 bits per 512 entries (0.0625 bits per coordinate). QSGD's and CGX's own
#: implementations default to buckets too (512 and 128). The papers' experiments pin
#: ``bucket_size=None`` explicitly (``gradzip bits table1``, ``gradzip reproduce``).
DEFAULT_BUCKET_SIZE = 512
#: the registered compressors whose default is :data:`DEFAULT_BUCKET_SIZE`
BUCKETED_BY_DEFAULT = ("dqsg", "ndqsg", "half_dither", "qsgd", "terngrad", "qsgd_l2")


def papers_scales(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` of compressor ``name`` with the papers' one scale per tensor pinned
    (``bucket_size=None``) where the library's default is bucketed and ``params`` does not
    choose: what every reproduction of a paper's numbers builds its compressors with."""
    out = dict(params)
    if name in BUCKETED_BY_DEFAULT and "bucket_size" not in out and "partitions" not in out:
        out["bucket_size"] = None
    return out


def check_bucket_size(bucket_size: int | None) -> int:
    """Normalize a ``bucket_size`` parameter: None or 0 mean one bucket per tensor."""
    if bucket_size is None:
        return 0
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 0:
        raise ValueError(f"bucket_size must be None or a positive int, got {bucket_size!r}")
    return bucket_size


def num_buckets(n: int, bucket_size: int) -> int:
    """Number of buckets of ``n`` elements (the last one may be shorter)."""
    if n == 0:
        return 0
    return 1 if bucket_size == 0 or bucket_size >= n else -(-n // bucket_size)


def bucket_absmax(x: torch.Tensor, bucket_size: int, absmax: float) -> torch.Tensor:
    """``max|x_B|`` per bucket as float32 (the scale of DQSG eq. 2, QSGD's max norm, ...)."""
    n = x.numel()
    nb = num_buckets(n, bucket_size)
    if nb == 1:
        return torch.tensor([absmax], dtype=torch.float32, device=x.device)
    full = n // bucket_size
    rows = x[: full * bucket_size].view(full, bucket_size)
    # separate amax/amin reductions are ~6x faster than aminmax(dim=1) on CPU
    scales = torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg_())
    if full < nb:
        tail = x[full * bucket_size :]
        lo_t, hi_t = torch.aminmax(tail)
        scales = torch.cat((scales, torch.maximum(-lo_t, hi_t).view(1)))
    # a zero bucket's scale is +0.0 (maximum(0.0, -0.0) may be either): the bytes on the wire
    # must not depend on the reduction's implementation
    return scales.abs_()


def per_element(values: torch.Tensor, n: int, bucket_size: int) -> torch.Tensor:
    """Broadcast one value per bucket to one value per element (length ``n``)."""
    if values.numel() == 1:
        return values.expand(n)
    counts = torch.full((values.numel(),), bucket_size, dtype=torch.int64)
    counts[-1] = n - bucket_size * (values.numel() - 1)
    return torch.repeat_interleave(values, counts)


def read_scales(body: memoryview, count: int) -> tuple[torch.Tensor, memoryview]:
    """Split ``count`` float32 scales off the front of a body."""
    size = 4 * count
    if len(body) < size:
        raise TruncatedPayloadError(f"body has {len(body)} bytes; its {count} scales need {size}")
    return body_tensor(body[:size], torch.float32), body[size:]


def scaled_symbols_body(
    scales: torch.Tensor,
    symbols: torch.Tensor,
    alphabet: int,
    packing: str,
    packed: torch.Tensor | None = None,
) -> Body:
    """The body of a scale-and-quantize codec: float32 scales, then the packed symbols.

    ``paper_bits = n*log2(L) + 32*#scales`` (spec 0.5); the scales are the side data.
    ``packed``: the symbols already packed (by a fused kernel), else they are packed here.
    """
    side = 32 * scales.numel()
    if packed is None:
        packed = pack_symbols(symbols, alphabet, packing)
    return Body(
        pieces=[scales, packed],
        paper_bits=symbols.numel() * math.log2(alphabet) + side,
        streams=(symbols,),
        side_bits=side,
    )


def fused_scaled_body(
    x: torch.Tensor,
    given: torch.Tensor | None,
    bucket_size: int,
    alphabet: int,
    encode_args: Mapping[str, Any],
    refuse: Callable[[], Exception],
) -> Body:
    """:func:`scaled_symbols_body`'s body (float32 scales, then the fixed-packed symbols) from
    :func:`~gradzip.kernels.dithered.fused_encode` (``encode_args``: its arithmetic), as one
    :class:`~gradzip.payload.Deferred` piece the kernel writes straight into the payload.
    ``given``: the scale of a one-bucket tensor, or None: the kernel computes every bucket's,
    and a non-finite one (the input was not finite) raises ``refuse()``. Nothing is copied, and
    no symbol array of the tensor's size exists: the symbol stream is unpacked from the
    payload's bytes only if ``entropy_bits`` asks for it."""
    n, bits = x.numel(), symbol_bits(alphabet)
    num_scales = num_buckets(n, bucket_size)
    written: list[np.ndarray] = []

    def write(out: np.ndarray) -> None:
        scales, _ = fused_encode(x, given, bucket_size, **encode_args, bits=bits, out=out)
        if given is None and not all_finite(scales):
            raise refuse()
        written.append(out)

    def streams() -> tuple[torch.Tensor, ...]:
        packed = torch.from_numpy(written[0][4 * num_scales :])
        return (unpack_symbols(packed, n, alphabet, "fixed"),)

    side = 32 * num_scales
    return Body(
        pieces=[Deferred(4 * num_scales + packed_bytes(n, bits), write)],
        paper_bits=n * math.log2(alphabet) + side,
        streams=streams,
        side_bits=side,
    )


def symbols_floor_bits(n: int, alphabet: int, packing: str) -> int:
    """The fewest bits ``n > 0`` packed symbols can take: exact for the fixed and dense packings;
    for the entropy coder its model, at least two bytes (the coded data may be empty)."""
    bits = packed_symbol_bits(n, alphabet, packing)
    return 16 if bits is None else bits


def scaled_symbols_floor_bits(n: int, bucket_size: int, alphabet: int, packing: str) -> int:
    """The fewest body bits of :func:`scaled_symbols_body` for ``n > 0`` elements (a
    ``min_body_bits``): ``32*#buckets`` plus :func:`symbols_floor_bits`."""
    return 32 * num_buckets(n, bucket_size) + symbols_floor_bits(n, alphabet, packing)


def scaled_symbols_bits(n: int, bucket_size: int, alphabet: int, packing: str) -> int | None:
    """Body bits of :func:`scaled_symbols_body`: ``32*#buckets`` + the packed symbols (None when
    entropy-coded)."""
    symbols = packed_symbol_bits(n, alphabet, packing)
    return None if symbols is None else 32 * num_buckets(n, bucket_size) + symbols
