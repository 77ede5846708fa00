"""top-k: keep the k largest magnitudes and send them with their indices."""

from __future__ import annotations

import math
from abc import abstractmethod
from functools import partial
from typing import Any, ClassVar, NoReturn

import numpy as np
import torch

from gradzip.codecs.bitpack import pack_bits, packed_bytes
from gradzip.compressors._decode_guards import check_finite_output, fitted
from gradzip.compressors._device_decode import DeviceDecoded, _diagnose
from gradzip.compressors._device_sparse import (
    decode_values_device,
    encode_values_device,
    false_flag,
    values_on_device,
    values_size,
)
from gradzip.compressors._sparse_coding import (
    SparseIndexCoding,
    ValueCodec,
    check_coding,
    coding_params,
    encode_values,
    parse_rice_indices,
    parse_values,
    rice_indices,
    value_compressor,
)
from gradzip.compressors.base import Body, Compressor, ParamValue
from gradzip.compressors.registry import register
from gradzip.device.ops import on_device
from gradzip.device.payloads import body_of, crc_ok, read_device_header
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.kernels.sparse import (
    pack_indices,
    scatter_add,
    topk_select,
    topk_select_torch,
    unpack_indices,
)
from gradzip.kernels.sparse_device import (
    indices_valid_device,
    pack_indices_device,
    packed_size,
    topk_select_device,
    unpack_indices_device,
)
from gradzip.keys import StreamKey
from gradzip.payload import Deferred, Header


def check_k_ratio(k: int | None, ratio: float | None) -> tuple[int, float]:
    """Validate a sparsifier's ``k`` / ``ratio`` pair (exactly one given); 0 marks the absent."""
    if (k is None) == (ratio is None):
        raise ValueError("give exactly one of k (coordinates kept) or ratio (fraction of d kept)")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        return k, 0.0
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}")
    return 0, float(ratio)


def kept_count(k: int, ratio: float, d: int) -> int:
    """Coordinates kept out of ``d``: ``min(k, d)``, or ``round_half_up(ratio*d)`` in ``[1, d]``."""
    if k:
        return min(k, d)
    return min(d, max(1, math.floor(ratio * d + 0.5)))


def index_bits(d: int) -> int:
    """``ceil(log2 d)``: bits per index (0 for ``d = 1``, where the index is implied)."""
    bits = (d - 1).bit_length()
    if bits > 32:
        raise ValueError(f"tensors of more than 2**32 elements are not supported (d = {d})")
    return bits


def topk_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Sorted indices of the ``k`` largest ``|x_i|``; ties at the threshold go to smaller indices.

    ``torch.topk`` and ``np.argpartition`` break ties arbitrarily, so only the threshold (the k-th
    largest magnitude, from an O(d) selection) is taken from them: every coordinate strictly above
    it is kept, and the remaining places go to the first coordinates equal to it, in index order.
    """
    d = x.size
    if k >= d:
        return np.arange(d, dtype=np.int64)
    mag = np.abs(x)
    threshold = np.partition(mag, d - k)[d - k]
    keep = mag > threshold
    missing = k - int(np.count_nonzero(keep))
    if missing:
        keep[np.flatnonzero(mag == threshold)[:missing]] = True
    return np.flatnonzero(keep)


def add_kept_(
    codec: str, out: torch.Tensor, header: Header, idx: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:
    """``out.view(-1)[idx] += values`` as adding the dense decoded tensor would do it: the kept
    float32 ``values`` are rounded to the payload's dtype and checked finite (the check
    :meth:`Compressor.decode` makes of its output, raising the same error) before ``out`` is
    touched, then converted to ``out``'s dtype (refused if one overflows it) and added, one
    rounding per kept element."""
    kept = values.to(header.dtype)
    check_finite_output(codec, kept)
    flat = out.view(-1)
    # refuses values out's dtype cannot hold; a widening cast is left to .to
    scatter_add(flat, idx, fitted(codec, kept, flat.dtype).to(flat.dtype))
    return out


def _gaps(idx: torch.Tensor) -> tuple[torch.Tensor]:
    """The index gaps ``idx_j - idx_(j-1) - 1`` (top-k's symbol stream), on ``idx``'s device."""
    return (torch.diff(idx, prepend=idx.new_full((1,), -1)) - 1,)


class KeptValues(Compressor):
    """Decoding shared by the sparsifiers whose payload is a set of kept ``(index, value)``
    pairs (top-k, rand-k): :meth:`_kept` returns the validated indices and finite float32 values,
    a decode scatters them into zeros, :meth:`decode_add_` adds them into ``out``."""

    @abstractmethod
    def _kept(self, body: memoryview, header: Header) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept indices (int64) and float32 values, every check of a decode made."""

    def _kept_device(
        self, body: torch.Tensor, header: Header
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_kept` on the device: the kept indices (int64, clamped into range so that a
        malformed body scatters safely), the float32 values and a 0-d flag that is False for
        a malformed body (the values' finiteness is the caller's check). Only where
        ``device_resident``."""
        raise NotImplementedError(f"{self.name} has no device decoder")

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        idx, values, ok = self._kept_device(body, header)
        out = torch.zeros(header.numel, dtype=torch.float32, device=body.device)
        return out.index_copy(0, idx, values), ok  # a copy keeps a kept -0.0, as on the host

    def _decode_add_device(
        self,
        payload: torch.Tensor,
        out: torch.Tensor,
        expected_key: StreamKey | None,
        dtype: torch.dtype | None,
    ) -> torch.Tensor:
        """:meth:`decode_add_` of a device payload: only the kept values are added, as the host
        path's :func:`add_kept_` adds them (a dense add would turn an ``out`` of ``-0.0`` at
        an unkept place into ``+0.0``); one header read and one flag read."""
        header, start = read_device_header(payload)
        self._check_header(header, expected_key, out.shape, dtype)
        body = body_of(payload, start)
        self._check_body_size(header, body, payload.numel(), vouched=True)
        if body.storage_offset() % 8:
            body = body.clone()  # as decode_device_payload: viewable as wider words
        idx, values, ok = self._kept_device(body, header)
        kept = values.to(header.dtype)
        cast = kept.to(out.dtype)
        ok = ok & crc_ok(payload) & torch.isfinite(kept).all() & torch.isfinite(cast).all()

        def diagnose() -> NoReturn:
            _diagnose(self, payload, expected_key, out.shape, dtype, None)

        DeviceDecoded(cast, ok, diagnose).checked()
        flat = out.view(-1)
        # distinct indices: one rounding per kept element, as the host scatter_add
        flat.index_add_(0, on_device(idx, flat.device), on_device(cast, flat.device))
        return out

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        idx, values = self._kept(body, header)
        out = torch.from_numpy(np.zeros(header.numel, dtype=np.float32))
        out.index_copy_(0, idx, values)  # a copy keeps a kept -0.0 (0.0 + -0.0 would not)
        return out

    def decode_add_(
        self,
        payload: bytes | bytearray | memoryview | torch.Tensor,
        out: torch.Tensor,
        *,
        expected_key: StreamKey | None = None,
        dtype: torch.dtype | None = None,
        side: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Add the kept values straight into ``out`` (see :meth:`Compressor.decode_add_`): no
        dense buffer; every check of :meth:`decode` is made before ``out`` is touched."""
        if isinstance(payload, torch.Tensor) and payload.numel() and self.device_resident:
            return self._decode_add_device(payload, out, expected_key, dtype)
        if len(payload) == 0 or isinstance(payload, torch.Tensor):
            return super().decode_add_(payload, out, expected_key=expected_key, dtype=dtype)
        header, body, _ = self._parsed(payload, expected_key, out.shape, dtype, None)
        idx, values = self._kept(body, header)
        return add_kept_(self.name, out, header, idx, values)


@register
class TopK(KeptValues):
    """top-k sparsification: keep the ``k`` largest ``|x_i|``, zero the rest (spec 4.2).

    [CHOICE] Ties at the k-th largest magnitude are broken by the smaller index, so the output is
    a deterministic function of ``x`` (no randomness at all).

    Wire: the ``k`` kept values as float32, then their indices in increasing order packed in
    ``b = ceil(log2 d)`` bits each (LSB-first; ``b = 0`` for ``d = 1``). Body bits, exactly:
    ``32 k + 8 ceil(k b / 8)``, i.e. ``k (32 + ceil(log2 d))`` rounded up to a whole byte.
    Paper bits: ``k (32 + ceil(log2 d))``. Entropy bits: ``32 k`` plus the empirical entropy of
    the index gaps (what a gap coder would need).

    Contraction (delta-approximate with ``delta = k/d``, deterministic, biased): for every x,
    ``||C(x) - x||^2 <= (1 - k/d) ||x||^2``, because the dropped coordinates are the smallest.
    Use it with :class:`gradzip.feedback.ErrorFeedback`, which makes the bias harmless.

    Parameters (exactly one): ``k`` (int >= 1, capped at d) or ``ratio`` in (0, 1] (keeps
    ``round_half_up(ratio d)`` [CHOICE], at least 1). Smaller ``k`` sends fewer bits but
    contracts less (``delta = k/d``), so error feedback needs more rounds to deliver the
    dropped mass.

    Device resident with ``index_coding="fixed"`` and ``value_codec`` ``"fp32"``, ``"fp16"``
    or ``"bf16"``: a tensor not on the CPU is selected, gathered and packed on its device into
    the host path's exact bytes (:mod:`gradzip.kernels.sparse_device`,
    :mod:`gradzip.compressors._device_sparse`), and a device payload decodes there. [CHOICE]
    ``index_coding="rice"`` (a variable-length entropy code) and the ``"qsgd"`` / ``"dqsg"``
    value payloads stay on the host.

    References: Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory" (NeurIPS 2018);
    Karimireddy et al., "Error Feedback Fixes SignSGD" (ICML 2019); DQGAN seed, Thm 1.
    """

    name = "topk"
    codec_id = 30
    checks_finite_output = True  # the kept values are checked, not the whole output
    example_params: ClassVar[dict[str, Any]] = {"ratio": 0.1}

    def __init__(
        self,
        k: int | None = None,
        ratio: float | None = None,
        index_coding: SparseIndexCoding = "fixed",
        value_codec: ValueCodec = "fp32",
        value_levels: int = 1,
    ) -> None:
        self.k, self.ratio = check_k_ratio(k, ratio)
        check_coding(index_coding, value_codec, value_levels)
        self.index_coding, self.value_codec = index_coding, value_codec
        self.value_levels = value_levels
        self._values = value_compressor(value_codec, value_levels)

    @property
    def device_resident(self) -> bool:  # type: ignore[override]
        """True for fixed-width indices with float32, fp16 or bf16 values (see the class
        docstring)."""
        return self.index_coding == "fixed" and values_on_device(self._values)

    @property
    def _original_wire(self) -> bool:
        return self.index_coding == "fixed" and self._values is None

    def wire_params(self) -> dict[str, ParamValue]:
        params: dict[str, ParamValue] = {"k": self.k, "ratio": self.ratio}
        params.update(coding_params(self.index_coding, self.value_codec, self.value_levels))
        return params

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        d = x.numel()
        k = kept_count(self.k, self.ratio, d)
        bits = index_bits(d)
        if x.device.type == "cpu":
            idx_np = topk_select(x.numpy(), k)
            idx = torch.from_numpy(idx_np)
        else:
            idx = topk_select_torch(x, k)
            idx_np = idx.cpu().numpy()
        gaps = torch.diff(idx, prepend=idx.new_full((1,), -1)).sub_(1)
        values = encode_values(self._values, x, idx, idx_np, key)
        pieces: list[torch.Tensor | memoryview | Deferred] = [values.piece]
        if self.index_coding == "rice":
            coded = rice_indices(idx_np)
            pieces.append(memoryview(coded))
            index_paper = 8.0 * (len(coded) - 4)  # the code words, not the parameter word
        else:
            if bits and x.device.type == "cpu":
                pieces.append(
                    Deferred(packed_bytes(k, bits), lambda out: pack_indices(idx_np, bits, out))
                )
            elif bits:
                pieces.append(pack_bits(idx, bits))
            index_paper = float(k * bits)
        return Body(
            pieces=pieces,
            paper_bits=values.paper_bits + index_paper,
            streams=(gaps,),
            side_bits=8 * values.piece.nbytes,
        )

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        d = x.numel()
        k = kept_count(self.k, self.ratio, d)
        bits = index_bits(d)
        idx = topk_select_device(x, k)
        values = encode_values_device(self._values, x, idx, key)
        pieces = [values.piece]
        if bits:
            pieces.append(pack_indices_device(idx, bits))
        return Body(
            pieces=pieces,
            paper_bits=values.paper_bits + float(k * bits),
            streams=partial(_gaps, idx),
            side_bits=8 * values.piece.nbytes,
        )

    def _kept_device(
        self, body: torch.Tensor, header: Header
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d = header.numel
        k = kept_count(self.k, self.ratio, d)
        bits = index_bits(d)
        start = values_size(self._values, k, header.key)
        size = packed_size(k, bits)
        device = body.device
        if body.numel() != start + size:  # the host decoder names the fault
            zeros = torch.zeros(k, dtype=torch.int64, device=device)
            return zeros, zeros.to(torch.float32), false_flag(device)
        values, ok = decode_values_device(self._values, body, k, header.key)
        valid = torch.ones((), dtype=torch.bool, device=device) if ok is None else ok
        if not bits:  # d = 1: the one index is implied
            return torch.zeros(1, dtype=torch.int64, device=device), values, valid
        packed = body.narrow(0, start, size)
        idx = unpack_indices_device(packed, k, bits)
        valid = valid & indices_valid_device(packed, idx, bits, d)
        return idx.clamp(0, d - 1), values, valid

    def _kept(self, body: memoryview, header: Header) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept ``(indices, float32 values)`` of a body, validated: exact size, zero padding
        bits, strictly increasing indices below ``d`` (values are read through a view)."""
        d = header.numel
        k = kept_count(self.k, self.ratio, d)
        bits = index_bits(d)
        values, rest = parse_values(self._values, body, k, header.key, self.name)
        if self.index_coding == "rice":
            idx = torch.from_numpy(parse_rice_indices(rest, k, d, self.name))
        else:
            idx = self._fixed_indices(rest, k, bits, d, len(body) - len(rest))
        check_finite_output(self.name, values)
        return idx, values

    def _fixed_indices(
        self, packed_body: memoryview, k: int, bits: int, d: int, before: int
    ) -> torch.Tensor:
        """The ``k`` indices packed in ``bits`` bits each, validated (``before``: the body bytes
        ahead of them, for the messages)."""
        expected = packed_bytes(k, bits)
        if len(packed_body) < expected:
            raise TruncatedPayloadError(
                f"topk body has {before + len(packed_body)} bytes; {k} values and indices need "
                f"{before + expected}"
            )
        if len(packed_body) > expected:
            raise CorruptPayloadError(
                f"topk body has {before + len(packed_body)} bytes, expected {before + expected}"
            )
        if not bits:
            return torch.zeros(1, dtype=torch.int64)
        packed = np.frombuffer(packed_body, dtype=np.uint8)
        tail_bits = (k * bits) % 8
        if tail_bits and int(packed[-1]) >> tail_bits:
            raise CorruptPayloadError("packed symbol stream has non-zero padding bits")
        idx, ok = unpack_indices(packed, k, bits, d)
        if not ok:
            if k > 1 and not bool((idx[1:] > idx[:-1]).all()):
                raise CorruptPayloadError("topk indices are not strictly increasing")
            raise CorruptPayloadError(f"topk index {int(idx[-1])} is out of range for d = {d}")
        return torch.from_numpy(idx)

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        """The original wire's size; None for a coded one (its size depends on the gaps and on
        the value payload's header)."""
        if not self._original_wire:
            return None
        d = x.numel()
        k = kept_count(self.k, self.ratio, d)
        return 32 * k + 8 * packed_bytes(k, index_bits(d))

    def min_body_bits(self, header: Header) -> int:
        d = header.numel
        k = kept_count(self.k, self.ratio, d)
        values = 32 * k if self._values is None else 32  # a value payload's length word
        if self.index_coding == "rice":
            return values + 64  # the Rice parameter and at least one code word
        return values + 8 * packed_bytes(k, index_bits(d))

    def contraction_delta(self, d: int) -> float:
        """``delta = k/d``, deterministic (Stich et al.'s k-contraction; seed Thm 1)."""
        return kept_count(self.k, self.ratio, d) / d
