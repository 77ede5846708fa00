"""The compressor contract every method implements.

A compressor is a *stateless* configuration object: ``encode(tensor, key)`` turns a tensor into a
self-validating payload of bytes (see :mod:`gradzip.payload`) and ``decode(payload, ...)`` turns
it back. Randomness is derived from the :class:`~gradzip.keys.StreamKey`, so the same key always
gives the same payload, and a separately constructed receiver regenerates any shared dither.
Stateful wrappers (error feedback) live outside, in :mod:`gradzip.feedback`.

Subclasses implement two hooks on flattened float32 data and declare their parameters:

* ``_encode_flat(x, key, absmax, shape) -> Body``: ``x`` is 1-D float32, finite, non-empty;
  ``absmax`` is ``max|x|`` (already computed by the finiteness scan); ``shape`` is the original
  tensor's shape (for codecs that group by rows or columns). A codec whose own pass sees every
  entry implements ``_encode_scanned(x, key, shape)`` instead where it can: then ``x`` is not
  scanned first, and that pass raises :class:`~gradzip.errors.NonFiniteInputError` itself.
* ``_decode_flat(body, header, side) -> Tensor``: returns 1-D float32 of ``header.numel``; must
  raise :class:`~gradzip.errors.PayloadError` subclasses on a body of the wrong size.
* ``wire_params()``: the parameters a receiver must share, written into the header and compared
  on decode (ints as zig-zag varints, floats as float64).
* ``expected_body_bits(x)``: the documented size formula of the body for input ``x``, or ``None``
  where it depends on an entropy coder; tests check it against the measured payload.
"""

from __future__ import annotations

import struct
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from gradzip.accounting import Encoded, Streams
from gradzip.buffers import fresh_array
from gradzip.compressors._decode_guards import (
    UNVOUCHED_CODED_ELEMENTS_PER_BYTE,
    UNVOUCHED_ELEMENTS_PER_BYTE,
    allocation_guard,
    check_declared_size,
    check_finite_output,
    fitted,
)
from gradzip.compressors._device_decode import DeviceDecoded, decode_device_payload
from gradzip.compressors._payload_size import framed_size, shape_probe
from gradzip.compressors.codec_names import codec_name
from gradzip.compressors.grid import CommonGrid
from gradzip.device.mode import device_path
from gradzip.device.ops import on_device
from gradzip.device.payloads import frame_device_payload, poisoned
from gradzip.errors import (
    KeyMismatchError,
    NonFiniteInputError,
    PayloadMismatchError,
    TruncatedPayloadError,
)
from gradzip.keys import StreamKey
from gradzip.payload import (
    DTYPE_CODES,
    MAX_ELEMENTS,
    Deferred,
    Header,
    encode_varint,
    frame_payload,
    parse_payload,
)

ParamValue = int | float | bool | str


@dataclass
class Body:
    """What ``_encode_flat`` returns: the body bytes and the pieces of its bit accounting.

    A piece is bytes-like, a CPU tensor (its bytes, copied once into the payload) or a
    :class:`~gradzip.payload.Deferred` writer that fills its part of the payload itself.
    """

    pieces: Sequence[bytes | bytearray | memoryview | torch.Tensor | Deferred]
    paper_bits: float
    #: the symbol streams, or a function building them when ``entropy_bits`` asks (see
    #: :class:`~gradzip.accounting.Encoded`)
    streams: Streams = field(default_factory=tuple)
    side_bits: int = 0
    #: a device body's flag (0-d bool on the device): whether the input was finite, computed by
    #: the encoding's own passes and never read by it (see :meth:`Compressor._encode_device`)
    finite: torch.Tensor | None = None


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """Zero-copy byte view of a contiguous CPU tensor (moved to the CPU first if needed)."""
    t = t.detach().contiguous()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().data.cast("B")


_NUMPY_DTYPES = {
    torch.uint8: np.uint8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
}


def body_tensor(body: memoryview, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Copy a body slice into a fresh, writable tensor of ``dtype`` (length must divide)."""
    itemsize = dtype.itemsize
    if len(body) % itemsize:
        raise TruncatedPayloadError(
            f"body slice of {len(body)} bytes is not a whole number of {dtype} items"
        )
    if len(body) == 0:
        return torch.empty(0, dtype=dtype)
    if dtype in _NUMPY_DTYPES:
        # a NumPy copy lands in huge-page-advised memory: far fewer page faults than a bytearray
        return torch.from_numpy(np.frombuffer(body, dtype=_NUMPY_DTYPES[dtype]).copy())
    return torch.frombuffer(bytearray(body), dtype=dtype)


def body_view(body: memoryview, dtype: torch.dtype) -> torch.Tensor:
    """A zero-copy tensor over a body slice, for reading only (the payload may be read-only).

    Decoders use it to read the body once, straight into their output (:func:`empty_output`).
    """
    itemsize = dtype.itemsize
    if len(body) % itemsize:
        raise TruncatedPayloadError(
            f"body slice of {len(body)} bytes is not a whole number of {dtype} items"
        )
    if len(body) == 0:
        return torch.empty(0, dtype=dtype)
    with warnings.catch_warnings():
        # torch warns that a read-only buffer gives a tensor it cannot protect; it is only read
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(body, dtype=dtype)


def empty_output(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised 1-D CPU tensor in recycled memory (:func:`gradzip.buffers.fresh_array`:
    a large one costs no page faults once the pool holds an idle array of its size)."""
    return torch.from_numpy(fresh_array(n, _NUMPY_DTYPES[dtype]))


def empty_output_on(
    n: int, dtype: torch.dtype = torch.float32, device: torch.device | None = None
) -> torch.Tensor:
    """:func:`empty_output` for host results (``device`` None), else a fresh 1-D tensor on
    ``device`` (device memory has its own caching allocator)."""
    if device is None:
        return empty_output(n, dtype)
    return torch.empty(n, dtype=dtype, device=device)


def encode_params(params: Mapping[str, ParamValue]) -> bytes:
    """Serialize a compressor's wire parameters (order matters)."""
    out = bytearray()
    for name, value in params.items():
        if isinstance(value, bool):
            out += encode_varint(int(value))
        elif isinstance(value, int):
            out += encode_varint((value << 1) if value >= 0 else ((-value << 1) - 1))
        elif isinstance(value, float):
            out += struct.pack("<d", value)
        elif isinstance(value, str):
            raw = value.encode()
            out += encode_varint(len(raw)) + raw
        else:  # pragma: no cover - programming error in a compressor
            raise TypeError(f"wire parameter {name!r} has unsupported type {type(value).__name__}")
    return bytes(out)


class Compressor(ABC):
    """Base class: validation, the wire format and the bit accounting around two hooks."""

    name: ClassVar[str]
    codec_id: ClassVar[int]
    #: decode needs the sender's key to regenerate shared randomness (dithers, random indices)
    uses_shared_randomness: ClassVar[bool] = False
    #: decode needs side information (nested quantization)
    needs_side_information: ClassVar[bool] = False
    #: the body encodes the original dtype losslessly (identity); others compute in float32
    keeps_input_dtype: ClassVar[bool] = False
    #: keyword parameters of a demonstration instance, used by the registry-wide contract tests,
    #: ``gradzip list`` and ``gradzip bench codecs``; must suit gradient-like data of any scale
    example_params: ClassVar[dict[str, Any]] = {}
    #: ``_decode_flat`` itself guarantees a finite output (it checks the few values the output
    #: is made of, or checks each block while it is in cache, and raises CorruptPayloadError),
    #: so :meth:`decode` skips its own separate pass over the output
    checks_finite_output: ClassVar[bool] = False
    #: ``_encode_flat`` runs on the tensor's own device (torch operations for non-CPU tensors,
    #: byte-identical to the CPU kernels, see :mod:`gradzip.kernels.backend`), so a CUDA
    #: gradient is compressed where it lives and only the packed body is copied to the host;
    #: other codecs move their input to the CPU first. [CHOICE] Untested on a real GPU: the
    #: device path is checked on CPU tensors through ``forced_torch_ops``.
    computes_on_device: ClassVar[bool] = False
    #: decoding a payload into a tensor costs less than copying a dense tensor of its values
    #: (the body is a small fraction of the values' bytes and decoding draws no randomness), so
    #: a rank re-decodes its own payload rather than keeping its reconstruction (see
    #: :meth:`gradzip.schemes.allgather_decode.AllGatherDecode.encode_flagged`)
    decodes_cheaply: ClassVar[bool] = False
    #: every value's encoding depends on that value alone (no shared scale, randomness or
    #: selection), so encoding tensors joined or apart gives the same values (identity, bf16);
    #: a scheme may then group tensors into one payload without changing any result
    encodes_each_value_alone: ClassVar[bool] = False
    #: the codec implements :meth:`_encode_device` and :meth:`_decode_device`: a tensor that is
    #: not on the CPU is encoded into a *device payload* (a ``uint8`` tensor on its device
    #: holding the host payload's exact bytes) and a device payload decodes on its device, with
    #: nothing gradient-sized crossing to the host (see :mod:`gradzip.device`)
    device_resident: ClassVar[bool] = False
    #: :meth:`expected_body_bits` depends on the tensor's shape and dtype alone, never on its
    #: values, and is the body's exact size in bits (up to the last byte's padding): then
    #: :meth:`fixed_payload_size` answers (where the formula gives a number: it is None for
    #: an entropy or Rice coded configuration). [CHOICE] True by default, as every codec's
    #: formula but a value-dependent one (a threshold's or an adaptive selection's count) is;
    #: those set it False, and ``tests/compressors/test_fixed_payload_size.py`` checks every
    #: registered codec's sizes against real payloads, so a new codec cannot get it wrong
    #: unnoticed.
    body_size_from_shape: ClassVar[bool] = True

    # -- hooks -------------------------------------------------------------------------------
    @abstractmethod
    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body: ...

    @abstractmethod
    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor: ...

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        """The body of ``x`` (1-D float32 on its device, non-empty, not scanned) computed on its
        device by torch operations (or device kernels) with nothing read back to the host: the
        pieces are tensors on the device whose bytes, in order, are exactly the host path's
        body; ``finite`` is a 0-d bool saying the input held no NaN or Inf (the body of a
        non-finite input may be anything). Only codecs with :attr:`device_resident`."""
        raise NotImplementedError(f"{self.name} has no device encoder")

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoded flat values (float32, or the payload's dtype for codecs that keep it) of
        a device body (1-D ``uint8`` on the device, its size already checked against the
        header) with nothing read back to the host, and a 0-d bool flag that is False where
        the body is malformed (a symbol outside the alphabet, a set padding bit), or None
        where the codec has nothing to check beyond finiteness. Only codecs with
        :attr:`device_resident`."""
        raise NotImplementedError(f"{self.name} has no device decoder")

    def _encode_scanned(
        self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]
    ) -> Body | None:
        """Optional hook: the body of ``x`` (as :meth:`_encode_flat`'s) from a pass that also
        proves every element finite, raising :meth:`non_finite_input` otherwise (before
        anything outside its own buffers is written), so that :meth:`encode` skips its separate
        ``aminmax`` scan; or None where the codec has no such path for ``x`` (the default), and
        :meth:`_encode_flat` runs after the scan. The fused bucketed kernels qualify: a bucket's
        max-abs bit pattern is non-finite exactly when the bucket holds a NaN or an Inf."""
        return None

    def non_finite_input(self) -> NonFiniteInputError:
        """The error :meth:`encode` raises for a tensor holding NaN or Inf."""
        return NonFiniteInputError(
            f"{self.name}: cannot encode a tensor holding NaN or Inf "
            f"(or values beyond the float32 range); nothing was updated"
        )

    def wire_params(self) -> dict[str, ParamValue]:
        """Parameters the receiver must share; written in the header, checked on decode."""
        return {}

    @property
    def bucket_size(self) -> int:
        """Elements per bucket with its own scale; 0 means one bucket per tensor."""
        return 0

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        """Documented body size in bits for input ``x`` (None if entropy-coded)."""
        return None

    def min_body_bits(self, header: Header) -> int:
        """The fewest body bits any valid payload of ``header.numel`` elements can have.

        O(1) arithmetic, checked before anything is allocated (see
        :mod:`gradzip.compressors._decode_guards`); exact for fixed-size bodies, the fixed part
        (scales, means, kept values) for sparse and entropy-coded ones. The default, 0, bounds
        nothing: codecs override it.
        """
        return 0

    def unvouched_elements_per_byte(self) -> int:
        """Without ``shape=``, the most elements one byte of this codec's payload may stand for
        (see :mod:`gradzip.compressors._decode_guards`): fewer for an entropy-coded symbol
        stream (wire parameter ``packing="entropy"``), whose decoder costs the most per
        element. A codec with another slow way to stand for many elements overrides it."""
        if self.wire_params().get("packing") == "entropy":
            return UNVOUCHED_CODED_ELEMENTS_PER_BYTE
        return UNVOUCHED_ELEMENTS_PER_BYTE

    # -- optional capabilities ---------------------------------------------------------------
    def common_grid(self) -> CommonGrid | None:
        """This compressor's levels on a scale the ranks agree on, for the integer-sum schemes
        (see :mod:`gradzip.compressors.grid`), or None where its codes cannot be added up
        (the default)."""
        return None

    def contraction_delta(self, d: int) -> float | None:
        """The ``delta`` in ``(0, 1]`` with ``E||C(x) - x||^2 <= (1 - delta) ||x||^2`` for
        every ``x`` of ``d >= 1`` elements (a delta-approximate compressor, spec 4.2), or None
        where this compressor has no such guarantee (the default). ``d`` is the size of one
        tensor: compressors work per parameter tensor."""
        return None

    def fixed_payload_size(
        self,
        shape: Sequence[int],
        dtype: torch.dtype = torch.float32,
        key: StreamKey | None = None,
    ) -> int | None:
        """The bytes of this compressor's payload of any tensor of ``shape`` and ``dtype``
        under ``key`` (default: the default key), whatever its values; None where the size
        depends on them (Rice, Elias or entropy coding, sparse selections). The same on every
        rank for the same arguments, so ranks can agree on a collective's slot size without a
        message (see :mod:`gradzip.compressors._payload_size`; with the key of the group's last
        rank it bounds every rank's payload)."""
        if not self.body_size_from_shape:
            return None
        probe = shape_probe(shape, dtype)
        if probe.numel() == 0:
            return 0  # an empty tensor's payload is empty
        body_bits = self.expected_body_bits(probe)
        if body_bits is None:
            return None
        key = key if key is not None else StreamKey()
        return framed_size(self.header_for(probe.shape, dtype, key), body_bits)

    def header_for(self, shape: Sequence[int], dtype: torch.dtype, key: StreamKey) -> Header:
        """The header :meth:`encode` writes for a tensor of ``shape`` and ``dtype`` under
        ``key``."""
        return Header(
            codec_id=self.codec_id,
            dtype=dtype,
            shape=tuple(shape),
            bucket_size=self.bucket_size,
            key=key,
            params=encode_params(self.wire_params()),
        )

    # -- public API --------------------------------------------------------------------------
    def encode(self, tensor: torch.Tensor, key: StreamKey | None = None) -> Encoded:
        """Compress ``tensor`` into a payload; raises on non-finite input (spec 0.3)."""
        key = key if key is not None else StreamKey()
        x = self._validated_flat(tensor)
        if x.numel() > MAX_ELEMENTS:
            raise ValueError(
                f"{self.name}: a tensor of {x.numel()} elements exceeds the {MAX_ELEMENTS} one "
                "payload holds; encode it in chunks (StreamKey.chunk)"
            )
        header = self.header_for(tuple(tensor.shape), tensor.dtype, key)
        if x.numel() == 0:
            return Encoded(b"", 0.0)
        if self.device_resident and device_path(x):
            return self._encoded_on_device(x, key, header)
        return self._framed(header, self._host_body(x, key, tuple(tensor.shape)))

    def _host_body(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        """The body of the flat, validated, non-empty host tensor ``x`` (raises on non-finite
        input, as :meth:`encode` does)."""
        body = self._encode_scanned(x, key, shape)
        if body is None:
            amin, amax = torch.aminmax(x)
            absmax = abs(max(-float(amin), float(amax)))  # +0.0 for an all-zero tensor
            if absmax != absmax or absmax == float("inf"):
                raise self.non_finite_input()
            body = self._encode_flat(x, key, absmax, shape)
        return body

    @staticmethod
    def _framed(header: Header, body: Body) -> Encoded:
        """The payload of ``header`` and ``body`` with its bit accounting."""
        pieces = [p if not isinstance(p, torch.Tensor) else tensor_bytes(p) for p in body.pieces]
        payload = frame_payload(header, pieces)
        return Encoded(payload, body.paper_bits, body.streams, body.side_bits)

    def _encoded_on_device(self, x: torch.Tensor, key: StreamKey, header: Header) -> Encoded:
        """A device payload of ``x`` (see :attr:`device_resident`): nothing is read back. A
        non-finite input gives a payload no receiver decodes (its CRC complemented) and an
        :class:`~gradzip.accounting.Encoded` whose :meth:`~gradzip.accounting.Encoded.verify`
        raises :meth:`non_finite_input`."""
        body = self._encode_device(x, key, header.shape)
        payload = frame_device_payload(header, body.pieces, x.device)  # type: ignore[arg-type]
        finite = body.finite
        if finite is None:
            finite = torch.isfinite(x).all()
        return Encoded(
            poisoned(payload, finite),
            body.paper_bits,
            body.streams,
            body.side_bits,
            finite=finite,
            refuse=self.non_finite_input,
        )

    def decode_device(
        self,
        payload: torch.Tensor,
        *,
        expected_key: StreamKey | None = None,
        shape: Sequence[int] | None = None,
        dtype: torch.dtype | None = None,
        side: torch.Tensor | None = None,
    ) -> DeviceDecoded:
        """Decode a device payload on its device without reading its validity back: the caller
        reads the flag (:meth:`DeviceDecoded.checked`, or a bucket's flags at once with
        :func:`gradzip.compressors._device_decode.require_all`). The header is read on the
        host (at most 128 bytes) and checked as :meth:`decode` checks it."""
        return decode_device_payload(self, payload, expected_key, shape, dtype, side)

    def decode(
        self,
        payload: bytes | bytearray | memoryview | torch.Tensor,
        *,
        expected_key: StreamKey | None = None,
        shape: Sequence[int] | None = None,
        dtype: torch.dtype | None = None,
        side: torch.Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """Rebuild the tensor from ``payload``.

        ``expected_key``/``shape``/``dtype``, when given, are checked against the header and a
        :class:`~gradzip.errors.PayloadMismatchError` names any difference. ``side`` is the side
        information of nested quantization.

        Passing ``shape`` also vouches for the tensor's size: without it, a payload may stand
        for at most ``UNVOUCHED_ELEMENTS_PER_BYTE`` (32) elements per byte, 16 if its symbols
        are entropy-coded (:meth:`unvouched_elements_per_byte`), so that a few hostile bytes
        cannot make the receiver allocate gigabytes or decode for seconds: any payload of up
        to 64 KiB is decoded or refused in well under 0.1 s and 64 MiB (see
        :mod:`gradzip.compressors._decode_guards`). Every size check happens before anything is
        allocated; a failed allocation, and a decoded NaN or Inf, raise a
        :class:`~gradzip.errors.PayloadError`.
        """
        if isinstance(payload, torch.Tensor):
            values = self.decode_device(
                payload, expected_key=expected_key, shape=shape, dtype=dtype, side=side
            ).checked()
            return values if device is None else values.to(device)
        if len(payload) == 0:
            return self._decode_empty(shape, dtype, device)
        header, body, side = self._parsed(payload, expected_key, shape, dtype, side)
        out = self._decoded(header, body, side)
        return out if device is None else out.to(device)

    def decode_add_(
        self,
        payload: bytes | bytearray | memoryview | torch.Tensor,
        out: torch.Tensor,
        *,
        expected_key: StreamKey | None = None,
        dtype: torch.dtype | None = None,
        side: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``out += decode(payload, shape=out.shape, ...)``, in place; returns ``out``.

        The sum is bitwise that of adding the dense decoded tensor (of the payload's dtype)
        to ``out``. A corrupt payload raises before ``out`` is touched, and so does one holding a
        value ``out``'s dtype cannot represent (a float64 payload's ``1e300`` into a float32
        ``out``): :class:`~gradzip.errors.PayloadMismatchError`, as :meth:`decode` refuses a
        non-finite output. [CHOICE] The sum's own overflow (finite ``out`` plus finite decoded
        values beyond the largest float) is the caller's arithmetic, as with ``out += t``, and
        is not checked: that would cost a pass over ``out`` on the fused hot path. Codecs whose
        :meth:`_decode_add_flat` adds straight into a float32 ``out`` (one pass, no dense
        temporary) do so; otherwise the payload is decoded and added. Sparse codecs override
        this to add only their kept values (a decoded zero added to ``out`` changes no bit of
        it: ``out + 0.0`` is ``out`` unless ``out`` is ``-0.0``).
        """
        if isinstance(payload, torch.Tensor):
            on_its_device = self.decode_device(
                payload, expected_key=expected_key, shape=out.shape, dtype=dtype, side=side
            )
            on_its_device.narrowed_to(out.dtype).checked()
            # the add runs on the decoded dtype (bitwise decode-then-add), not on the cast
            return out.add_(on_device(on_its_device.values, out.device))
        if len(payload) == 0:
            return out.add_(self._decode_empty(out.shape, dtype, out.device))
        header, body, side = self._parsed(payload, expected_key, out.shape, dtype, side)
        if self._fused_into(self._decode_add_flat, header, body, side, out):
            return out
        decoded = self._decoded(header, body, side)
        fitted(self.name, decoded, out.dtype)  # refuses values out's dtype cannot hold
        # the add itself runs on the decoded dtype (bitwise decode-then-add), not on the cast
        return out.add_(decoded.to(out.device))

    def decode_into_(
        self,
        payload: bytes | bytearray | memoryview | torch.Tensor,
        out: torch.Tensor,
        *,
        expected_key: StreamKey | None = None,
        dtype: torch.dtype | None = None,
        side: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``out[...] = decode(payload, shape=out.shape, ...)``, in place; returns ``out``.

        The values are bitwise :meth:`decode`'s (cast to ``out``'s dtype). Codecs whose
        :meth:`_decode_into_flat` writes straight into a float32 ``out`` do so, so no fresh
        output is allocated: [CHOICE] on the development machine the first touch of a fresh
        64 MB output (its page faults, with huge pages zeroed by the kernel) took longer than
        decoding into it, and up to 13x longer with two threads writing it. A corrupt payload
        raises; ``out``'s values are then unspecified. A valid payload holding a value ``out``'s
        dtype cannot represent (a float64 payload's ``1e300`` into a float32 ``out``, a float32
        one's ``1e5`` into a float16 ``out``) raises
        :class:`~gradzip.errors.PayloadMismatchError` before ``out`` is touched instead of
        writing Inf.
        """
        if isinstance(payload, torch.Tensor):
            decoded = self.decode_device(
                payload, expected_key=expected_key, shape=out.shape, dtype=dtype, side=side
            ).narrowed_to(out.dtype)
            return out.copy_(decoded.checked())
        if len(payload) == 0:
            return out.copy_(self._decode_empty(out.shape, dtype, out.device))
        header, body, side = self._parsed(payload, expected_key, out.shape, dtype, side)
        if self._fused_into(self._decode_into_flat, header, body, side, out):
            return out
        return out.copy_(fitted(self.name, self._decoded(header, body, side), out.dtype))

    def _fused_into(
        self,
        fused: Callable[[memoryview, Header, torch.Tensor | None, torch.Tensor], bool],
        header: Header,
        body: memoryview,
        side: torch.Tensor | None,
        out: torch.Tensor,
    ) -> bool:
        """Whether ``fused`` (:meth:`_decode_add_flat` or :meth:`_decode_into_flat`) took the
        payload straight into ``out``: only for a float32 payload and a contiguous float32 CPU
        ``out``."""
        if not (
            header.dtype == torch.float32
            and out.dtype == torch.float32
            and out.device.type == "cpu"
            and out.is_contiguous()
        ):
            return False
        with allocation_guard(self.name, header.shape):
            return fused(body, header, side, out.view(-1))

    def _decode_into_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """Write the decoded values into ``out`` (1-D float32, CPU, ``header.numel`` elements)
        and return True, or return False without touching ``out`` (the caller then decodes and
        copies). An override must give the bits :meth:`_decode_flat` gives and must write
        finite values only (what :meth:`decode` checks). Default: False."""
        return False

    def _decode_add_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """Add the decoded values into ``out`` (1-D float32, CPU, ``header.numel`` elements)
        and return True, or return False without touching ``out`` (the caller then decodes and
        adds). An override must give the bits of ``out + decoded`` (the value computed as
        ``_decode_flat`` does, then one float32 add), must validate the whole body before it
        writes, and must add finite values only (what :meth:`decode` checks). Default: False.
        """
        return False

    def _parsed(
        self,
        payload: bytes | bytearray | memoryview,
        expected_key: StreamKey | None,
        shape: Sequence[int] | None,
        dtype: torch.dtype | None,
        side: torch.Tensor | None,
    ) -> tuple[Header, memoryview, torch.Tensor | None]:
        """Parse a non-empty payload and run every check made before anything is allocated;
        returns the header, the body and the side information as a flat float32 CPU tensor."""
        header, body = parse_payload(payload)
        self._check_header(header, expected_key, shape, dtype)
        if self.needs_side_information:
            side = self._checked_side(side, header).cpu()
        self._check_body_size(header, body, len(payload), vouched=shape is not None)
        return header, body, side

    def _checked_side(self, side: torch.Tensor | None, header: Header) -> torch.Tensor:
        """The side information, checked against the header, as flat float32 (on its device)."""
        if side is None:
            raise ValueError(f"{self.name} decoding needs side information (side=...)")
        if side.numel() != header.numel:
            raise PayloadMismatchError(
                f"side information has {side.numel()} elements; the payload has {header.numel}"
            )
        return side.detach().reshape(-1).to(torch.float32)

    def _decoded(self, header: Header, body: memoryview, side: torch.Tensor | None) -> torch.Tensor:
        """The decoded CPU tensor of a parsed payload, checked finite."""
        with allocation_guard(self.name, header.shape):
            flat = self._decode_flat(body, header, side)
            out = flat.reshape(header.shape).to(header.dtype)
        # encoders refuse non-finite input, so a non-finite output is a corrupt body (spec 0.3)
        # a codec's own check covers its float32 output; a cast to a 16-bit dtype can overflow
        if not self.checks_finite_output or out.element_size() < 4:
            check_finite_output(self.name, out)
        return out

    def round_trip(
        self,
        tensor: torch.Tensor,
        key: StreamKey | None = None,
        side: torch.Tensor | None = None,
    ) -> tuple[Encoded, torch.Tensor]:
        """Encode, then decode with the same key: what a receiver would reconstruct."""
        encoded = self.encode(tensor, key)
        if not encoded.payload:
            return encoded, tensor.detach().clone()
        return encoded, self.decode(
            encoded.payload, expected_key=key, shape=tensor.shape, side=side
        )

    def describe(self) -> str:
        """One line: the name and the parameters."""
        params = ", ".join(f"{k}={v}" for k, v in self.wire_params().items())
        return f"{self.name}({params})"

    # -- helpers -----------------------------------------------------------------------------
    def _validated_flat(self, tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{self.name}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in DTYPE_CODES:
            raise TypeError(
                f"{self.name}: dtype {tensor.dtype} is not supported; "
                f"use one of {sorted(str(d) for d in DTYPE_CODES)}"
            )
        flat = tensor.detach().reshape(-1)
        if not self.keeps_input_dtype and flat.dtype != torch.float32:
            flat = flat.to(torch.float32)
        if flat.device.type != "cpu" and not (self.computes_on_device or self.device_resident):
            flat = flat.cpu()
        return flat

    def _check_body_size(
        self,
        header: Header,
        body: memoryview | torch.Tensor,
        payload_bytes: int,
        *,
        vouched: bool,
    ) -> None:
        if header.numel == 0:
            raise PayloadMismatchError("a non-empty payload cannot hold an empty tensor")
        check_declared_size(
            self.name,
            header.numel,
            len(body),
            payload_bytes,
            self.min_body_bits(header),
            None if vouched else self.unvouched_elements_per_byte(),
        )

    def _check_header(
        self,
        header: Header,
        expected_key: StreamKey | None,
        shape: Sequence[int] | None,
        dtype: torch.dtype | None,
    ) -> None:
        if header.codec_id != self.codec_id:
            raise PayloadMismatchError(
                f"payload was written by codec '{codec_name(header.codec_id)}' "
                f"(id {header.codec_id}); this decoder is '{self.name}' (id {self.codec_id})"
            )
        mine = encode_params(self.wire_params())
        if header.params != mine:
            raise PayloadMismatchError(
                f"payload was encoded with other {self.name} parameters than this decoder's "
                f"({self.describe()}): {header.params.hex()} != {mine.hex()}"
            )
        if header.bucket_size != self.bucket_size:
            raise PayloadMismatchError(
                f"payload uses bucket size {header.bucket_size}; this decoder uses {self.bucket_size}"
            )
        if expected_key is not None and header.key != expected_key:
            raise KeyMismatchError(
                f"payload keys differ from the receiver's: {header.key.describe_difference(expected_key)}"
            )
        if shape is not None and tuple(shape) != header.shape:
            raise PayloadMismatchError(f"payload shape {header.shape} != expected {tuple(shape)}")
        if dtype is not None and dtype != header.dtype:
            raise PayloadMismatchError(f"payload dtype {header.dtype} != expected {dtype}")

    def _decode_empty(
        self,
        shape: Sequence[int] | None,
        dtype: torch.dtype | None,
        device: torch.device | str | None,
    ) -> torch.Tensor:
        if shape is None:
            raise TruncatedPayloadError(
                "empty payload: it stands for an empty tensor only when the receiver passes the "
                "expected shape; otherwise the bytes were lost"
            )
        numel = 1
        for d in shape:
            numel *= d
        if numel != 0:
            raise TruncatedPayloadError(
                f"empty payload, but the expected shape {tuple(shape)} has {numel} elements"
            )
        return torch.empty(tuple(shape), dtype=dtype or torch.float32, device=device)
