"""Bit accounting shared by every compressor (spec 0.5).

Each payload reports three numbers:

* ``wire_bits``: ``8 * len(payload)``, measured; header and CRC included.
* ``paper_bits``: the papers' raw count, ``n*log2(L) + 32*(#float32 scalars)`` for a quantizer,
  or the count the method's own paper uses (e.g. ``32*nnz`` for threshold quantization).
* ``entropy_bits``: ``sum over symbol streams of n*H(empirical histogram) + side bits`` (the
  DQSG paper's Table 2), computed lazily because it needs a histogram pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cached_property

import numpy as np
import torch


def empirical_entropy_bits(symbols: torch.Tensor) -> float:
    """``n * H`` of the empirical symbol histogram, in bits (0 for an empty stream)."""
    n = symbols.numel()
    if n == 0:
        return 0.0
    flat = symbols.reshape(-1)
    if flat.dtype == torch.uint8 and flat.device.type == "cpu":
        # a 256-bin histogram straight from the bytes (no widening copy): ~50x faster
        hist = np.bincount(flat.contiguous().numpy(), minlength=256)
        counts = torch.from_numpy(hist[hist > 0].astype(np.float64))
        return float(n * math.log2(n) - (counts * torch.log2(counts)).sum())
    if flat.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        low = int(flat.min())
        counts = torch.bincount((flat.to(torch.int64) - low) if low else flat.to(torch.int64))
    else:
        counts = torch.unique(flat, return_counts=True)[1]
    counts = counts[counts > 0].to(torch.float64)
    # n*H = n*log2(n) - sum c*log2(c)
    return float(n * math.log2(n) - (counts * torch.log2(counts)).sum())


#: symbol streams, or a function that builds them on first use
Streams = Sequence[torch.Tensor] | Callable[[], Sequence[torch.Tensor]]


class Encoded:
    """One compressed tensor: the payload bytes and their bit accounting.

    ``streams`` may be a function building the symbol streams: a codec whose symbols can be
    rebuilt from what it keeps anyway (one-bit's signs from its packed words) then spends no
    pass and no memory on them unless ``streams`` or ``entropy_bits`` is read.
    """

    def __init__(
        self,
        payload: bytes | memoryview | torch.Tensor,
        paper_bits: float,
        streams: Streams = (),
        side_bits: int = 0,
        *,
        finite: torch.Tensor | None = None,
        refuse: Callable[[], Exception] | None = None,
    ) -> None:
        self.payload = payload
        #: a device payload's flag (0-d bool on the device): whether the input was finite; the
        #: encoder never reads it (see :meth:`verify`); None for host payloads, whose encoder
        #: refused non-finite input before returning
        self.finite = finite
        self._refuse = refuse
        self.paper_bits = float(paper_bits)
        self._streams = streams
        self.side_bits = side_bits

    @property
    def on_device(self) -> bool:
        """Whether the payload is a device payload (a ``uint8`` tensor on the tensor's device:
        see :mod:`gradzip.device`) rather than host bytes."""
        return isinstance(self.payload, torch.Tensor)

    def verify(self) -> None:
        """Raise the compressor's :class:`~gradzip.errors.NonFiniteInputError` if the input was
        not finite. A host payload's encoder has refused such input already; a device encoder
        does not read its flag back (that would stall the device), so a caller that needs to
        know reads it here, once (the schemes do, per bucket, before anything is sent)."""
        if self.finite is not None and self._refuse is not None:
            from gradzip.device.host_reads import host_read

            if not bool(host_read(self.finite)):
                raise self._refuse()

    @cached_property
    def streams(self) -> tuple[torch.Tensor, ...]:
        """The symbol streams (built on first use where the codec gave a function)."""
        streams = self._streams
        self._streams = ()  # drop the builder and what it holds
        return tuple(streams() if callable(streams) else streams)

    @property
    def wire_bits(self) -> int:
        """Measured size of the payload in bits (header and checksum included)."""
        return 8 * len(self.payload)

    @cached_property
    def entropy_bits(self) -> float:
        """Empirical entropy of the symbol streams plus the side data (scales, means), in bits."""
        return sum(empirical_entropy_bits(s) for s in self.streams) + float(self.side_bits)

    def __repr__(self) -> str:
        return (
            f"Encoded(wire_bits={self.wire_bits}, paper_bits={self.paper_bits:.1f}, "
            f"bytes={len(self.payload)})"
        )
