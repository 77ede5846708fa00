"""One-bit quantization (Seide et al.), as evaluated by Dryden et al. (spec 5.1, 5.4)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

import numpy as np
import torch

from gradzip.accounting import Encoded, Streams
from gradzip.codecs.symbols import (
    Packing,
    check_packing,
    pack_symbols,
    packed_symbol_bits,
    unpack_symbols,
)
from gradzip.compressors._groups import Group, Grouping, check_group, sample_rows
from gradzip.compressors._scaled_body import read_scales, symbols_floor_bits
from gradzip.compressors.base import (
    Body,
    Compressor,
    ParamValue,
    body_tensor,
    empty_output,
    encode_params,
    tensor_bytes,
)
from gradzip.compressors.registry import register
from gradzip.device.mode import device_path
from gradzip.device.ops import host_array
from gradzip.device.payloads import frame_device_payload, poisoned
from gradzip.errors import CorruptPayloadError, NonFiniteInputError, TruncatedPayloadError
from gradzip.kernels.onebit_device import (
    column_means_device,
    expand_signs_device,
    pack_signs_device,
    residual_device,
    sign_sums_device,
)
from gradzip.kernels.onebit_signs import (
    column_means,
    expand_add_signs,
    expand_signs,
    pack_signs,
    subtract_reconstruction,
)
from gradzip.keys import StreamKey
from gradzip.payload import MAX_ELEMENTS, Header, frame_payload
from gradzip.rng import local_generator

SAMPLE_ROWS = 128


def _unpacked_signs(packed: np.ndarray, rows: int) -> tuple[torch.Tensor]:
    """The sign stream ``1[V_ic >= 0]`` as ``(cols, rows)`` uint8, from the packed words."""
    bits = np.unpackbits(packed, axis=1, count=rows, bitorder="little")
    return (torch.from_numpy(bits),)


def _false(device: torch.device) -> torch.Tensor:
    """A 0-d False flag on ``device``."""
    return torch.zeros((), dtype=torch.bool, device=device)


def _device_signs(m: torch.Tensor) -> tuple[torch.Tensor]:
    """The sign stream of a device encoding, ``(cols, rows)`` uint8 on its device, on request."""
    return (torch.ge(m, 0).to(torch.uint8),)


def _check_means(means: torch.Tensor) -> None:
    """Every decoded value is one of the means: checking them checks the whole output."""
    if not bool(torch.isfinite(means).all()):
        raise CorruptPayloadError("onebit column means are not finite")


@register
class OneBit(Compressor):
    """One-bit quantization: the sign of each entry plus two float32 means per column.

    Per column ``c`` (a group, see below): ``bit_ic = 1[V_ic >= 0]`` (0 counts as positive) and
    ``V_hat_ic = mu+_c`` if the bit is set, else ``mu-_c``, where ``mu+_c`` / ``mu-_c`` are the
    means of the non-negative / negative entries (0 when there are none). Without sampling the
    column sums are preserved exactly, ``sum_i V_hat_ic = sum_i V_ic``.

    Wire, per column: ``mu+``, ``mu-`` (float32), then the bits LSB-first in ``ceil(rows/32)``
    little-endian uint32 words (padding bits zero). Body bits ``cols*(64 + 32*ceil(rows/32))``;
    ``paper_bits = rows*cols + 64*cols`` (the ``n + 64*#groups`` of the DQSG paper's Table 1).

    ``packing="dense"`` or ``"entropy"`` ([CHOICE], the library-wide symbol packings) send all
    the means first, then the ``n`` bits as one symbol stream (:mod:`gradzip.codecs.symbols`):
    ``64*cols + 8*ceil(n/8)`` bits for "dense"; "entropy" pays off only on skewed signs.

    Contraction (deterministic, biased): each mean is the least-squares value of its sign class,
    so without sampling ``||V - V_hat||^2 = ||V||^2 - sum_c (n+_c mu+_c^2 + n-_c mu-_c^2)
    <= ||V||^2``, with equality only for an all-zero tensor. Being biased it is meant to run under
    error feedback (``gradzip.feedback.ErrorFeedback``), whose accumulated error telescopes
    (spec 0.6).

    Parameters:
        group: ``"out"`` (default) makes one column per output unit, a row of
            ``V.reshape(shape[0], -1)`` ([CODE], LBANN's per-neuron grouping); ``"in"`` uses the
            other axis (the DQSG authors' grouping, spec 1.9). 0-d and 1-D tensors are one column.
            More, smaller columns cost 64 bits each but track the data more closely.
        sample: estimate the means from 128 rows drawn uniformly with replacement (sender's
            local randomness) when a column has more than 128 rows (spec 5.4): cheaper on long
            columns, at the cost of losing the exact column sums; the estimates are what is sent,
            so error feedback stays exact.

    Device resident with ``packing="fixed"`` (the default; with or without ``sample``): a tensor
    not on the CPU is encoded on its device into the host path's exact bytes (the float64
    column sums in the kernels' order, see :mod:`gradzip.kernels.onebit_device`) and a device
    payload decodes there; so does the fused error-feedback step
    (:meth:`encode_with_feedback`) for a tensor on a device. [CHOICE] ``packing="dense"`` and
    ``"entropy"`` stay on the host (their symbol coders are host code), as does ``sample``'s
    draw of the rows: it depends on the key alone, so it is made on the host and sent to the
    device (a host-to-device copy of ``128 cols`` indices, never a read of the gradient).

    References: Seide et al., "1-bit stochastic gradient descent and its application to
    data-parallel distributed training of speech DNNs", Interspeech 2014; Dryden et al.,
    "Communication Quantization for Data-parallel Training of Deep Neural Networks", MLHPC 2016.
    """

    name = "onebit"
    codec_id = 20
    checks_finite_output = True
    example_params: ClassVar[dict[str, Any]] = {}
    #: one bit a value and two means per column: expanding the bits reads 1/32 of what copying
    #: a float32 reconstruction reads
    decodes_cheaply: ClassVar[bool] = True

    def __init__(
        self, group: Group = "out", sample: bool = False, packing: Packing = "fixed"
    ) -> None:
        self.group = check_group(group)
        self.sample = bool(sample)
        self.packing = check_packing(packing)

    def wire_params(self) -> dict[str, ParamValue]:
        return {"group": self.group, "sample": self.sample, "packing": self.packing}

    @property
    def device_resident(self) -> bool:  # type: ignore[override]
        """True for ``packing="fixed"`` (see the class docstring); the other packings encode
        and decode on the host."""
        return self.packing == "fixed"

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        g = Grouping.of(tuple(x.shape), self.group)
        if self.packing == "fixed":
            return g.groups * (64 + 32 * -(-g.size // 32))
        packed = packed_symbol_bits(g.groups * g.size, 2, self.packing)
        return None if packed is None else 64 * g.groups + packed

    def min_body_bits(self, header: Header) -> int:
        g = Grouping.of(header.shape, self.group)
        if self.packing == "fixed":
            return g.groups * (64 + 32 * -(-g.size // 32))
        return 64 * g.groups + symbols_floor_bits(header.numel, 2, self.packing)

    def _encode_scanned(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        """The packing pass sees every entry and refuses NaN and Inf itself: no scan before
        it."""
        body, _, finite = self._encode_body(x, key, shape)
        if not finite:
            raise self.non_finite_input()
        return body

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        return self._encode_scanned(x, key, shape)

    def _encode_body(
        self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]
    ) -> tuple[Body, np.ndarray, bool]:
        """The body, the ``(cols, 2)`` float32 means it carries and whether every entry of
        ``x`` is finite (seen by the same pass that packs the signs)."""
        g = Grouping.of(shape, self.group)
        m = g.matrix(x)  # a view: the kernels read any strides
        cols, rows = g.groups, g.size
        # one pass: sign bits packed into words (straight into the fixed body, behind each
        # column's means), signs counted and summed per column
        out = np.empty((cols, 8 + 4 * -(-rows // 32)), dtype=np.uint8)
        packed, counts, sums = pack_signs(m, out[:, 8:])
        means, finite = column_means(counts, sums, rows)
        if self.sample and rows > SAMPLE_ROWS:
            picks = local_generator(key).integers(0, rows, size=(cols, SAMPLE_ROWS))
            stats = sample_rows(m.contiguous(), torch.from_numpy(picks))
            _, s_counts, s_sums = pack_signs(stats)
            means = column_means(s_counts, s_sums, SAMPLE_ROWS)[0]
        streams: Streams
        if self.packing == "fixed":
            out[:, :8] = means.view(np.uint8)
            pieces: list[memoryview | torch.Tensor] = [out.reshape(-1).data]
            # the sign stream, for the entropy accounting, rebuilt from the words on request:
            # writing it eagerly cost a pass over the input and a byte per entry
            streams = partial(_unpacked_signs, packed, rows)
        else:
            # [CHOICE] the other packings put all the means first and the symbols last
            symbols = torch.ge(m, 0).view(torch.uint8)
            pieces = [
                torch.from_numpy(means),
                pack_symbols(symbols.reshape(-1), 2, self.packing),
            ]
            streams = (symbols,)
        body = Body(
            pieces=pieces,
            paper_bits=float(rows * cols + 64 * cols),
            streams=streams,
            side_bits=64 * cols,
        )
        return body, means, finite

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        return self._device_body(x, key, shape)[0]

    def _device_body(
        self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]
    ) -> tuple[Body, torch.Tensor]:
        """The fixed packing's body of ``x`` on its device and the ``(cols, 2)`` float32 means
        it carries (the host path's :meth:`_encode_body`, nothing read back)."""
        g = Grouping.of(shape, self.group)
        m = g.matrix(x)
        cols, rows = g.groups, g.size
        packed, counts, sums = pack_signs_device(m)
        means = column_means_device(counts, sums, rows)
        if self.sample and rows > SAMPLE_ROWS:
            # the host path's draw (from the key alone), sent to the device as a constant
            picks = local_generator(key).integers(0, rows, size=(cols, SAMPLE_ROWS))
            rows_t = host_array(np.asarray(picks, dtype=np.int64), x.device)
            stats = sample_rows(m, rows_t)
            s_counts = (stats >= 0).to(torch.int64).sum(dim=1, keepdim=True)
            means = column_means_device(s_counts, sign_sums_device(stats), SAMPLE_ROWS)
        body = Body(
            pieces=[torch.cat((means.view(torch.uint8), packed), dim=1)],
            paper_bits=float(rows * cols + 64 * cols),
            streams=partial(_device_signs, m),
            side_bits=64 * cols,
        )
        return body, means

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        g = Grouping.of(header.shape, self.group)
        cols, rows = g.groups, g.size
        width = 8 + 4 * -(-rows // 32)
        if body.numel() != cols * width:  # a longer body: the host decoder says why
            return torch.zeros(header.numel, device=body.device), _false(body.device)
        raw = body.reshape(cols, width)
        means = raw.narrow(1, 0, 8).clone(memory_format=torch.contiguous_format)
        means = means.view(torch.float32)
        values, padding_clear = expand_signs_device(raw.narrow(1, 8, width - 8), means, rows)
        flat = values.reshape(-1) if g.axis == 1 else values.t().reshape(-1)
        return flat, padding_clear & torch.isfinite(means).all()

    def _feedback_on_device(
        self, v: torch.Tensor, key: StreamKey, reconstruct: bool
    ) -> tuple[Encoded, torch.Tensor | None]:
        """:meth:`encode_with_feedback` for a ``v`` on a device: a device payload and
        ``v - v_hat`` computed there, with nothing read back. [CHOICE] Whether ``v`` was finite
        is not read either: for non-finite ``v`` the payload is poisoned (as
        :meth:`Compressor.encode`'s), ``v`` keeps its values (a select on the device flag) and
        the encoding's :meth:`~gradzip.accounting.Encoded.verify` raises."""
        flat = v.reshape(-1)
        shape = tuple(v.shape)
        header = Header(
            codec_id=self.codec_id,
            dtype=v.dtype,
            shape=shape,
            bucket_size=self.bucket_size,
            key=key,
            params=encode_params(self.wire_params()),
        )
        body, means = self._device_body(flat, key, shape)
        finite = torch.isfinite(flat).all()
        payload = frame_device_payload(header, body.pieces, v.device)  # type: ignore[arg-type]
        encoded = Encoded(
            poisoned(payload, finite),
            body.paper_bits,
            body.streams,
            body.side_bits,
            finite=finite,
            refuse=self.non_finite_input,
        )
        g = Grouping.of(shape, self.group)
        m = g.matrix(flat)
        # V_hat by v's own signs: the value expand_signs decodes from the payload's bits
        residual, v_hat = residual_device(m, means, reconstruct)
        g.matrix(flat).copy_(torch.where(finite, residual, m))
        if v_hat is None:
            return encoded, None
        flat_hat = v_hat.reshape(-1) if g.axis == 1 else v_hat.t().reshape(-1)
        return encoded, flat_hat.reshape(shape)

    def encode_with_feedback(
        self, v: torch.Tensor, key: StreamKey, *, reconstruct: bool = False
    ) -> tuple[Encoded, torch.Tensor | None] | None:
        """Error feedback's fused step (see :class:`gradzip.feedback.FusedFeedback`): encode
        ``v`` and turn ``v``, in place, into ``v - v_hat``; ``v_hat``, returned when
        ``reconstruct``, is bitwise what :meth:`decode` gives for the payload.

        The payload is byte-identical to :meth:`encode`'s. Two passes over ``v`` instead of
        five (the bounds check, the encode, the sender's decode, its finite check and the
        subtraction): the packing pass also sees non-finite entries, and the second pass
        writes ``e = v - v_hat`` (and ``v_hat``) from ``v``'s signs and the means. Serves a
        contiguous float32 CPU ``v``; returns None, with ``v`` untouched, for anything else.
        Raises :class:`~gradzip.errors.NonFiniteInputError` (``v`` untouched) on NaN or Inf.

        A contiguous float32 ``v`` on a device (or any, inside
        :func:`~gradzip.device.mode.forced_device_payloads`) with the fixed packing is served
        there (see :meth:`_feedback_on_device`): a device payload, ``v`` updated on its device.
        """
        if v.dtype != torch.float32 or not v.is_contiguous():
            return None
        if v.numel() == 0 or v.numel() > MAX_ELEMENTS:
            return None  # the generic path answers both
        if self.device_resident and device_path(v):
            return self._feedback_on_device(v, key, reconstruct)
        if v.device.type != "cpu":
            return None
        flat = v.reshape(-1)
        shape = tuple(v.shape)
        body, means, finite = self._encode_body(flat, key, shape)
        if not finite:
            raise NonFiniteInputError(
                f"{self.name}: cannot encode a tensor holding NaN or Inf; nothing was updated"
            )
        header = Header(
            codec_id=self.codec_id,
            dtype=v.dtype,
            shape=shape,
            bucket_size=self.bucket_size,
            key=key,
            params=encode_params(self.wire_params()),
        )
        pieces = [p if not isinstance(p, torch.Tensor) else tensor_bytes(p) for p in body.pieces]
        encoded = Encoded(
            frame_payload(header, pieces), body.paper_bits, body.streams, body.side_bits
        )
        grouping = Grouping.of(shape, self.group)
        v_hat = empty_output(flat.numel()) if reconstruct else None
        subtract_reconstruction(
            grouping.matrix(flat).numpy(),
            means,
            None if v_hat is None else grouping.matrix(v_hat).numpy(),
        )
        return encoded, None if v_hat is None else v_hat.reshape(shape)

    def _decode_into_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """The fixed packing writes each column's ``mu+`` / ``mu-`` straight into ``out``."""
        return self._expand_into(body, header, out, expand_signs)

    def _decode_add_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """The fixed packing adds each column's ``mu+`` / ``mu-`` into ``out`` by its bits in
        one pass (no decoded temporary), after the means and the padding bits are checked."""
        return self._expand_into(body, header, out, expand_add_signs)

    def _expand_into(
        self,
        body: memoryview,
        header: Header,
        out: torch.Tensor,
        expand: Callable[[np.ndarray, np.ndarray, np.ndarray], bool],
    ) -> bool:
        if self.packing != "fixed":
            return False
        g = Grouping.of(header.shape, self.group)
        means, packed = self._read_fixed(body, g.groups, g.size)
        _check_means(means)
        if not expand(packed, means.numpy(), g.matrix(out).numpy()):
            raise CorruptPayloadError("onebit padding bits are set")
        return True

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        flat = empty_output(header.numel)
        # the fixed packing: one pass, each column's bits select its mu+ / mu- into the output
        if self._decode_into_flat(body, header, side, flat):
            return flat
        g = Grouping.of(header.shape, self.group)
        means, positive = self._read_packed(body, g.groups, g.size)
        _check_means(means)
        # select mu+ or mu- bitwise: mu- ^ (bit * (mu+ ^ mu-)) on the float32 bit patterns is
        # exact and takes two passes (a where() with broadcasting is several times slower)
        pattern = means.numpy().view(np.int32)
        grouped = np.multiply(positive, (pattern[:, 0] ^ pattern[:, 1]).reshape(-1, 1))
        grouped ^= pattern[:, 1:]
        g.matrix(flat).copy_(torch.from_numpy(grouped.view(np.float32)))
        return flat

    @staticmethod
    def _read_fixed(body: memoryview, cols: int, rows: int) -> tuple[torch.Tensor, np.ndarray]:
        words = -(-rows // 32)
        expected = cols * (8 + 4 * words)
        if len(body) < expected:
            raise TruncatedPayloadError(f"onebit body has {len(body)} bytes, needs {expected}")
        if len(body) > expected:
            raise CorruptPayloadError(f"onebit body has {len(body)} bytes, expected {expected}")
        raw = np.frombuffer(body, dtype=np.uint8).reshape(cols, 8 + 4 * words)
        means = torch.from_numpy(raw[:, :8].copy().view(np.float32))
        return means, raw[:, 8:]

    def _read_packed(
        self, body: memoryview, cols: int, rows: int
    ) -> tuple[torch.Tensor, np.ndarray]:
        means, rest = read_scales(body, 2 * cols)
        symbols = unpack_symbols(body_tensor(rest), cols * rows, 2, self.packing)
        if symbols.numel() and int(symbols.max()) > 1:
            raise CorruptPayloadError("onebit symbol stream holds a symbol other than 0 or 1")
        return means.view(cols, 2), symbols.view(cols, rows).numpy()
