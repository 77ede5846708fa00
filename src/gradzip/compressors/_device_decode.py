"""Decoding a device payload where it lives (see :mod:`gradzip.device`).

The header is read on the host once (:func:`~gradzip.device.payloads.read_device_header`) and
checked as a host payload's; the codec's ``_decode_device`` decodes the body on the device;
the CRC, the codec's own validity checks (symbols in the alphabet, zero padding bits) and the
finiteness of the output are folded into one 0-d flag on the device. A caller reads that flag
once (:meth:`DeviceDecoded.checked`), or the flags of a whole bucket at once
(:func:`require_all`); only when it is down is the payload copied to the host and decoded
there, to raise the precise error (:func:`diagnose`) a host payload would.

So decoding a valid device payload reads on the host: one header prefix (at most 128 bytes)
and one flag (shared by every payload of the bucket where the caller uses :func:`require_all`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, NoReturn, Protocol

import torch

from gradzip.compressors._decode_guards import allocation_guard
from gradzip.device.host_reads import host_read
from gradzip.device.ops import on_device
from gradzip.device.payloads import body_of, computed_crc, crc_ok, read_device_header, stored_crc
from gradzip.errors import CorruptPayloadError, NonFiniteSenderError
from gradzip.keys import StreamKey
from gradzip.payload import Header


class _Codec(Protocol):
    """What decoding a device payload asks of a :class:`~gradzip.compressors.base.Compressor`
    (a protocol, so that this module does not import the base class that imports it)."""

    name: ClassVar[str]
    needs_side_information: ClassVar[bool]

    @property
    def device_resident(self) -> bool: ...

    def decode(
        self,
        payload: bytes,
        *,
        expected_key: StreamKey | None = ...,
        shape: Sequence[int] | None = ...,
        dtype: torch.dtype | None = ...,
        side: torch.Tensor | None = ...,
    ) -> torch.Tensor: ...

    def _decode_empty(
        self, shape: Sequence[int] | None, dtype: torch.dtype | None, device: torch.device
    ) -> torch.Tensor: ...

    def _check_header(
        self,
        header: Header,
        expected_key: StreamKey | None,
        shape: Sequence[int] | None,
        dtype: torch.dtype | None,
    ) -> None: ...

    def _check_body_size(
        self, header: Header, body: torch.Tensor, payload_bytes: int, *, vouched: bool
    ) -> None: ...

    def _checked_side(self, side: torch.Tensor | None, header: Header) -> torch.Tensor: ...

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclass
class DeviceDecoded:
    """A decoded device payload, not yet known valid: ``values`` (the payload's shape and
    dtype, on its device) are meaningful only where ``ok`` (a 0-d bool on the device) holds;
    ``diagnose()`` raises the error a host decode of the same bytes raises."""

    values: torch.Tensor
    ok: torch.Tensor
    diagnose: Callable[[], NoReturn]

    def checked(self) -> torch.Tensor:
        """``values``, after one host read of ``ok`` (raising the precise error if down)."""
        require_all([self])
        return self.values

    def narrowed_to(self, dtype: torch.dtype) -> DeviceDecoded:
        """``values`` cast to ``dtype``, ``ok`` also requiring the cast finite (a float64
        ``1e300`` into float32 must be refused, not written as Inf)."""
        if dtype == self.values.dtype:
            return self
        cast = self.values.to(dtype)
        return DeviceDecoded(cast, self.ok & torch.isfinite(cast).all(), self.diagnose)


def require_all(decoded: Sequence[DeviceDecoded]) -> None:
    """Read the AND of every ``ok`` on the host, once; if it is down, raise the first failing
    payload's error (the error path reads more)."""
    if not decoded:
        return
    flags = torch.stack([d.ok for d in decoded])
    if bool(host_read(flags.all()).item()):
        return
    for d, good in zip(decoded, host_read(flags).tolist(), strict=True):
        if not good:
            d.diagnose()
    raise CorruptPayloadError("a device payload was refused, yet each one alone decodes")


def decode_device_payload(
    codec: _Codec,
    payload: torch.Tensor,
    expected_key: StreamKey | None,
    shape: Sequence[int] | None,
    dtype: torch.dtype | None,
    side: torch.Tensor | None,
) -> DeviceDecoded:
    """Decode ``payload`` on its device (see the module); ``codec.decode``'s checks."""
    device = payload.device

    def diagnose() -> NoReturn:
        _diagnose(codec, payload, expected_key, shape, dtype, side)

    if payload.numel() == 0:
        values = codec._decode_empty(shape, dtype, device)
        return DeviceDecoded(values, torch.ones((), dtype=torch.bool, device=device), diagnose)
    header, start = read_device_header(payload)
    codec._check_header(header, expected_key, shape, dtype)
    body = body_of(payload, start)
    codec._check_body_size(header, body, payload.numel(), vouched=shape is not None)
    if codec.needs_side_information:
        side = codec._checked_side(side, header)
        side = on_device(side, device)
    if not codec.device_resident:  # a host codec: the payload's bytes decode on the host
        data = host_read(payload).tobytes()
        host_side = None if side is None else torch.from_numpy(host_read(side))
        values = codec.decode(
            data, expected_key=expected_key, shape=shape, dtype=dtype, side=host_side
        )
        ok = torch.ones((), dtype=torch.bool, device=device)
        return DeviceDecoded(on_device(values, device), ok, diagnose)
    with allocation_guard(codec.name, header.shape):
        if body.storage_offset() % 8:
            # [CHOICE] the header's length varies, so the body starts anywhere: one copy on the
            # device lets a codec view it as any dtype of up to 8 bytes (as BODY_ALIGN does for
            # host payloads)
            body = body.clone()
        flat, valid = codec._decode_device(body, header, side)
        values = flat.reshape(header.shape).to(header.dtype)
    ok = crc_ok(payload) & torch.isfinite(values).all()
    if valid is not None:
        ok = ok & valid
    return DeviceDecoded(values, ok, diagnose)


def _diagnose(
    codec: _Codec,
    payload: torch.Tensor,
    expected_key: StreamKey | None,
    shape: Sequence[int] | None,
    dtype: torch.dtype | None,
    side: torch.Tensor | None,
) -> NoReturn:
    """Raise the error of a refused device payload: the host decoder's, on its bytes."""
    stored, computed = (
        int(v) for v in host_read(torch.stack([stored_crc(payload), computed_crc(payload)]))
    )
    if stored == computed ^ 0xFFFFFFFF:
        raise NonFiniteSenderError(
            f"{codec.name}: the sender's input held NaN or Inf (its encoder marked the payload "
            "invalid by complementing the CRC-32); nothing was decoded"
        )
    data = host_read(payload).tobytes()
    host_side = None if side is None else torch.from_numpy(host_read(side)).reshape(-1)
    codec.decode(data, expected_key=expected_key, shape=shape, dtype=dtype, side=host_side)
    raise CorruptPayloadError(
        f"{codec.name}: the device decoder refused a payload the host decoder accepts "
        f"(CRC {'ok' if stored == computed else 'bad'}); please report this"
    )


__all__ = ["DeviceDecoded", "crc_ok", "decode_device_payload", "require_all"]
