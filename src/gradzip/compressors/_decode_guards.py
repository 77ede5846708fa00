"""The checks every decode passes around the codec's own work (spec 0.3 applied to receivers).

* Before anything is allocated or decoded: the element count the header declares against what
  the body can hold (:func:`check_declared_size`), so a payload of a few bytes cannot make the
  receiver allocate gigabytes or run a decoding loop for seconds.
* Around the codec: an allocation that fails anyway surfaces as a
  :class:`~gradzip.errors.PayloadError` (:func:`allocation_guard`).
* After it: a decoded tensor holding NaN or +-Inf is refused (:func:`check_finite_output`),
  just as encoders refuse non-finite input; so is one written into a narrower ``out``
  (``decode_into_``/``decode_add_``) that holds a value the narrower dtype cannot represent
  (:func:`fitted`): a float64 ``1e300`` would be written as Inf.

[CHOICE] Capacity rule. Each codec states the fewest body bits a valid payload of ``n`` elements
can have (``Compressor.min_body_bits``): exact for fixed-width and dense packings (``b`` bits an
element: ``n <= 8*B/b``), the fixed parts (scales, column means, kept values) for the rest.
Sparse and entropy-coded bodies can legitimately stand for any number of zeros (top-k or rand-k
with a fixed ``k``, threshold, adaptive, QSGD's Elias code, the entropy coder on a stream that is
almost all one symbol: its ANS coder spends as little as ``2**-24`` of a bit on such a symbol),
so the body alone cannot bound ``n``. For them the receiver decides: a caller that passes
``shape=`` vouches for the size (every gradzip scheme does; the shape is checked against the
header), and a payload decoded without ``shape=`` may stand for at most

* :data:`UNVOUCHED_ELEMENTS_PER_BYTE` (32) elements per byte of payload, where the decoded
  tensor itself is the cost (a dense tensor of zeros plus a few values: about 1 to 10 ns and
  12 bytes an element at worst, a float32 decode cast to float64), and
* :data:`UNVOUCHED_CODED_ELEMENTS_PER_BYTE` (16) for an entropy-coded symbol stream
  (``packing="entropy"``), whose decoder takes tens of ns a symbol (30 to 40 ns for the ANS
  coder alone on the development machine when the alphabet allows no grouping), i.e. an
  average of at least half a bit a symbol.

So a payload of 64 KiB decodes to at most 2 Mi elements (1 Mi entropy-coded), within the
0.1 s and 64 MiB that ``benchmarks/hostile_decode.py`` checks for every codec; a refused one
names the limit and ``shape=`` as the way to accept it. Real compressed gradients rarely come
close on normal values: top-k at ``ratio=0.01`` and the entropy-coded ternary quantizers
stay below the caps. The cost is that decoding a sparser payload without its shape needs
``shape=`` (top-k at ``ratio=1e-3`` exceeds the cap).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from gradzip.errors import (
    CorruptPayloadError,
    PayloadError,
    PayloadMismatchError,
    TruncatedPayloadError,
)

#: without ``shape=``, the most elements one byte of payload may stand for (see the module doc)
UNVOUCHED_ELEMENTS_PER_BYTE = 32
#: the same for a payload whose symbols are entropy-coded (``packing="entropy"``)
UNVOUCHED_CODED_ELEMENTS_PER_BYTE = 16


def check_declared_size(
    codec: str,
    numel: int,
    body_bytes: int,
    payload_bytes: int,
    min_body_bits: int,
    unvouched_per_byte: int | None,
) -> None:
    """Refuse a header whose element count its body cannot hold (O(1), nothing allocated).

    ``min_body_bits`` is the codec's floor for ``numel`` elements. ``unvouched_per_byte`` is
    None when the caller passed the shape it expects (so the allocation is its own choice),
    else the most elements a byte of this payload may stand for (the constants above).
    """
    if 8 * body_bytes < min_body_bits:
        raise TruncatedPayloadError(
            f"{codec} payload declares {numel} elements, which need a body of at least "
            f"{-(-min_body_bits // 8)} bytes; it has {body_bytes}"
        )
    if unvouched_per_byte is not None and numel > unvouched_per_byte * payload_bytes:
        limit = (
            "UNVOUCHED_CODED_ELEMENTS_PER_BYTE"
            if unvouched_per_byte == UNVOUCHED_CODED_ELEMENTS_PER_BYTE
            else "UNVOUCHED_ELEMENTS_PER_BYTE"
        )
        raise CorruptPayloadError(
            f"{codec} payload of {payload_bytes} bytes declares {numel} elements, more than "
            f"the {unvouched_per_byte} per byte ({limit}) a payload decoded without shape= may "
            "stand for; pass shape= to decode a tensor that large from so few bytes"
        )


def _is_allocation_failure(err: BaseException) -> bool:
    # torch reports a failed CPU allocation as a RuntimeError ("DefaultCPUAllocator: can't
    # allocate memory"); any other RuntimeError is a bug and must not be disguised
    return isinstance(err, MemoryError) or (
        isinstance(err, RuntimeError) and "alloc" in str(err).lower()
    )


@contextmanager
def allocation_guard(codec: str, shape: tuple[int, ...]) -> Iterator[None]:
    """Turn a failed allocation inside a decoder into a :class:`PayloadError`."""
    try:
        yield
    except (MemoryError, RuntimeError) as err:
        if not _is_allocation_failure(err):
            raise
        raise PayloadError(
            f"{codec}: the payload's tensor of shape {shape} cannot be allocated ({err})"
        ) from err


def check_finite_output(codec: str, out: torch.Tensor) -> None:
    """Refuse a decoded tensor holding NaN or +-Inf (one fused min/max pass, no temporary)."""
    if out.numel() == 0:
        return
    lo, hi = torch.aminmax(out.reshape(-1))
    lo_f, hi_f = float(lo), float(hi)  # NaN propagates into both
    if not (abs(lo_f) < float("inf") and abs(hi_f) < float("inf")):
        raise CorruptPayloadError(
            f"{codec} payload decodes to non-finite values (NaN or Inf): its body is corrupt"
        )


def fitted(codec: str, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (finite, as :meth:`Compressor.decode` returns them) cast to ``dtype``, refused
    if a value overflows it to +-Inf (float64 into float32, float32 into float16).

    Only a cast to a dtype of smaller range costs a pass (the cast itself, which the caller's
    write makes anyway, plus one min/max pass); a widening or same-dtype cast returns
    ``values`` as they are. Nothing is written anywhere before the check, so a refusal leaves
    the caller's ``out`` untouched.
    """
    if not (
        dtype.is_floating_point
        and values.dtype.is_floating_point
        and torch.finfo(dtype).max < torch.finfo(values.dtype).max
    ):
        return values
    cast = values.to(dtype)
    if cast.numel():
        lo, hi = torch.aminmax(cast.reshape(-1))
        if not (abs(float(lo)) < float("inf") and abs(float(hi)) < float("inf")):
            raise PayloadMismatchError(
                f"{codec} payload of dtype {values.dtype} holds values beyond the range of "
                f"the output's dtype {dtype} (largest finite {torch.finfo(dtype).max:.6g}): "
                f"they would be written as Inf; decode it into a {values.dtype} tensor"
            )
    return cast
