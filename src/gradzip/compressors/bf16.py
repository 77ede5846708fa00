"""bf16: bfloat16, a round-to-nearest-even cast with float32's exponent range."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from gradzip.compressors.base import Body, Compressor, body_view, empty_output
from gradzip.compressors.registry import register
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.keys import StreamKey
from gradzip.payload import Deferred, Header

_BF16_MAX = torch.finfo(torch.bfloat16).max


@register
class BF16(Compressor):
    """bfloat16: the top 16 bits of float32, rounded to nearest even (``x.to(torch.bfloat16)``).

    bfloat16 has float32's 8-bit exponent, so no scale is needed: tiny and huge gradients keep
    their magnitude (down to bfloat16's smallest subnormal, 2**-133), at 8 bits of precision.

    Bits: ``16 n`` (body); paper bits the same.

    Error (deterministic, no variance): ``|x_hat_i - x_i| <= 2**-8 |x_i|`` for normal values;
    delta-approximate with ``delta >= 1 - 2**-16``. Compared with ``fp16``: 8x the relative
    error, but no values lost to underflow however wide the range.

    [CHOICE] Saturating: the few finite float32 values within 2**-9 of float32's maximum, which a
    plain cast turns into Inf, are sent as bfloat16's largest finite value instead. Everywhere
    else the payload equals ``x.to(torch.bfloat16)`` bit for bit.

    Parameters: none.

    Device resident (every configuration; see :mod:`gradzip.device`): a tensor not on the CPU
    is cast on its device into the same bytes (the same saturating clamp, then the cast), and a
    device payload decodes there.

    References: Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training" (2019).
    """

    name = "bf16"
    codec_id = 3
    encodes_each_value_alone = True
    device_resident = True
    example_params: ClassVar[dict[str, Any]] = {}

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        src = x.clamp(-_BF16_MAX, _BF16_MAX) if absmax > _BF16_MAX else x

        def write_bf16(out: np.ndarray) -> None:
            # the cast writes straight into the payload (copy_ rounds as .to(bfloat16) does)
            torch.from_numpy(out).view(torch.bfloat16).copy_(src)

        bits = 16 * x.numel()
        return Body(
            pieces=[Deferred(2 * x.numel(), write_bf16)], paper_bits=float(bits), side_bits=bits
        )

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        expected = 2 * header.numel
        if len(body) < expected:
            raise TruncatedPayloadError(f"bf16 body has {len(body)} bytes, needs {expected}")
        if len(body) > expected:
            raise CorruptPayloadError(f"bf16 body has {len(body)} bytes, expected {expected}")
        out = empty_output(header.numel)
        out.copy_(body_view(body, torch.bfloat16))  # the body is read once, into the output
        return out

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        # clamping finite values that do not exceed the bound changes nothing, so the host
        # path's conditional clamp and this unconditional one give the same bits
        bits = 16 * x.numel()
        return Body(
            pieces=[x.clamp(-_BF16_MAX, _BF16_MAX).to(torch.bfloat16)],
            paper_bits=float(bits),
            side_bits=bits,
        )

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return body.view(torch.bfloat16).to(torch.float32), None

    def expected_body_bits(self, x: torch.Tensor) -> int:
        return 16 * x.numel()

    def min_body_bits(self, header: Header) -> int:
        return 16 * header.numel
