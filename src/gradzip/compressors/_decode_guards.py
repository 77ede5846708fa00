"""The checks every decode passes around the codec's own work (spec 0.3 applied to receivers).

* Before anything is allocated or decoded: the element count the header declares against what
  the body can hold (:func:`check_declared_size`), so a payload of a few bytes cannot make the
  receiver allocate gigabytes or run a decoding loop for seconds.
* Around the codec: an allocation that fails anyway surfaces as a
  :class:`~gradzip.errors.PayloadError` (:func:`allocation_guard`).
* After it: a decoded tensor holding NaN or +-Inf is refused (:func:`check_finite_output`),
  just as encoders refuse non-finite input.

[CHOICE] Capacity rule. Each codec states the fewest body bits a valid payload of ``n`` elements
can have (``Compressor.min_body_bits``): exact for fixed-width and dense packings, the fixed
parts (scales, column means, kept values) for the rest. Sparse and entropy-coded bodies can
legitimately stand for any number of zeros (top-k or rand-k with a fixed ``k``, threshold,
adaptive, QSGD's Elias code, the entropy coder on a constant stream), so the body alone cannot
bound ``n``. For them the receiver decides: a caller that passes ``shape=`` vouches for the
size (every gradzip scheme does; the shape is checked against the header), and a payload
decoded without ``shape=`` may stand for at most :data:`UNVOUCHED_ELEMENTS_PER_BYTE` elements
per byte of payload (2**16: 32 KiB of payload for the largest tensor one payload may hold,
2**31 elements, while a 50-byte payload decodes to at most 3.3 million elements). Real
compressed gradients stay orders of magnitude below that ratio (top-k at ``ratio=1e-4`` keeps
one value per ~1,400 elements and byte); a refused one names ``shape=`` as the way to accept it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from gradzip.errors import CorruptPayloadError, PayloadError, TruncatedPayloadError

#: without ``shape=``, the most elements one byte of payload may stand for (see the module doc)
UNVOUCHED_ELEMENTS_PER_BYTE = 2**16


def check_declared_size(
    codec: str,
    numel: int,
    body_bytes: int,
    payload_bytes: int,
    min_body_bits: int,
    vouched: bool,
) -> None:
    """Refuse a header whose element count its body cannot hold (O(1), nothing allocated).

    ``min_body_bits`` is the codec's floor for ``numel`` elements; ``vouched`` says the caller
    passed the shape it expects (so the allocation is its own choice).
    """
    if 8 * body_bytes < min_body_bits:
        raise TruncatedPayloadError(
            f"{codec} payload declares {numel} elements, which need a body of at least "
            f"{-(-min_body_bits // 8)} bytes; it has {body_bytes}"
        )
    if not vouched and numel > UNVOUCHED_ELEMENTS_PER_BYTE * payload_bytes:
        raise CorruptPayloadError(
            f"{codec} payload of {payload_bytes} bytes declares {numel} elements, more than "
            f"{UNVOUCHED_ELEMENTS_PER_BYTE} per byte; pass shape= to decode a tensor that large "
            "from so few bytes"
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
