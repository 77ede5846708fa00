"""Identity: the uncompressed baseline, sent losslessly in the tensor's own dtype."""

from __future__ import annotations

import torch

from gradzip.compressors.base import Body, Compressor, body_tensor
from gradzip.compressors.registry import register
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.keys import StreamKey
from gradzip.payload import Header


@register
class Identity(Compressor):
    """No compression: the raw values in their own dtype (the papers' 32-bit baseline).

    Bits: ``8 * itemsize * n`` on the wire (32 per coordinate for float32), ``32 n`` paper bits.
    Variance: 0. Use it as the reference run against which compressed runs are compared.
    """

    name = "identity"
    codec_id = 1
    keeps_input_dtype = True

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
        raw = body_tensor(body, torch.int16 if header.dtype == torch.bfloat16 else header.dtype)
        values = raw.view(torch.bfloat16) if header.dtype == torch.bfloat16 else raw
        return values.to(torch.float32) if header.dtype != torch.float64 else values

    def expected_body_bits(self, x: torch.Tensor) -> int:
        return 8 * x.element_size() * x.numel()

    def min_body_bits(self, header: Header) -> int:
        return 8 * torch.empty(0, dtype=header.dtype).element_size() * header.numel
