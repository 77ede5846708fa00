"""Identity: the uncompressed baseline, sent losslessly in the tensor's own dtype."""

from __future__ import annotations

import torch

from gradzip.compressors.base import Body, Compressor, body_view, empty_output
from gradzip.compressors.registry import register
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.keys import StreamKey
from gradzip.payload import Header


@register
class Identity(Compressor):
    """No compression: the raw values in their own dtype (the papers' 32-bit baseline).

    Bits: ``8 * itemsize * n`` on the wire (32 per coordinate for float32), ``32 n`` paper bits.
    Variance: 0. Use it as the reference run against which compressed runs are compared.

    Device resident (every dtype; see :mod:`gradzip.device`): the body of a tensor not on the
    CPU is its own bytes, framed on its device, and a device payload decodes there.
    """

    name = "identity"
    codec_id = 1
    keeps_input_dtype = True
    encodes_each_value_alone = True
    device_resident = True

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        return Body(pieces=[x], paper_bits=32.0 * x.numel(), streams=(), side_bits=32 * x.numel())

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        itemsize = torch.empty(0, dtype=header.dtype).element_size()
        expected = header.numel * itemsize
        if len(body) < expected:
            raise TruncatedPayloadError(f"identity body has {len(body)} bytes, needs {expected}")
        if len(body) > expected:
            raise CorruptPayloadError(f"identity body has {len(body)} bytes, expected {expected}")
        # the body is read once, into the output (converted on the way for 16-bit dtypes)
        wide = torch.float64 if header.dtype == torch.float64 else torch.float32
        out = empty_output(header.numel, wide)
        if header.numel:
            out.copy_(body_view(body, header.dtype))
        return out

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        n = x.numel()
        return Body(pieces=[x], paper_bits=32.0 * n, streams=(), side_bits=32 * n)

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # as the host path: the values widened to float32 (float64 kept), then cast back to
        # the payload's dtype by the caller; every widening and its inverse are exact
        wide = torch.float64 if header.dtype == torch.float64 else torch.float32
        return body.view(header.dtype).to(wide), None

    def expected_body_bits(self, x: torch.Tensor) -> int:
        return 8 * x.element_size() * x.numel()

    def min_body_bits(self, header: Header) -> int:
        return 8 * torch.empty(0, dtype=header.dtype).element_size() * header.numel

    def contraction_delta(self, d: int) -> float:
        """``delta = 1``: no error."""
        return 1.0
