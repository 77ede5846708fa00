"""How the sparsifiers (top-k, rand-k) code their kept set: top-k's indices and both's values.

Index coding (top-k only: rand-k's indices come from shared randomness and cost no bit):

* ``"fixed"``: each index in ``ceil(log2 d)`` bits, LSB-first (the original wire);
* ``"rice"``: the gaps ``g_j = idx_j - idx_(j-1) - 1`` (``idx_(-1) = -1``, so every gap is
  ``>= 0``) Rice-coded (:mod:`gradzip.codecs.golomb_rice`) with the Golomb-optimal parameter
  ``K`` of their mean, sent as a ``uint32`` word before the code words. [CHOICE] Rice rather
  than Elias: a top-k set spread over the tensor has roughly geometric gaps, for which Rice
  with the fitted ``K`` is within a few percent of the gaps' entropy, and a ``K`` computed
  from the mean costs one word. About ``log2(d/k) + 1.5`` bits an index instead of
  ``ceil(log2 d)`` (at ``k/d = 1%`` on 2^24 values: about 8.1 against 24).

Value coding (the ``k`` kept values, in increasing index order):

* ``"fp32"``: ``k`` float32 (the original wire);
* ``"fp16"``, ``"bf16"``, ``"qsgd"``, ``"dqsg"``: the values as a whole payload of that gradzip
  compressor, keyed by the message's own key and preceded by its length (``uint32``).
  [CHOICE] The inner payload repeats a header (a few tens of bytes, nothing against thousands
  of values) but brings that codec's own validation, key check and bit accounting. ``qsgd`` and
  ``dqsg`` quantize with one max-norm scale over the kept values (``bucket_size=None``) and
  ``value_levels`` levels (QSGD's ``s``, DQSG's ``M``): at one level, ternary symbols in 2 bits
  a value; unbiased given the kept set (QSGD, spec 2.1) or with a subtractive dither (DQSG,
  spec 1.2), so with error feedback the quantization error joins the residual like the
  dropped coordinates.

Bits per coordinate at ``k/d`` kept: ``(k/d) (index bits + value bits)``; at ``k/d = 1%``,
rice indices and one-level QSGD values, about ``0.01 (8.1 + 2) = 0.1`` bit a coordinate
against ``0.01 (24 + 32) = 0.56`` for the original wire on 2^24 values.
"""

from __future__ import annotations

import struct
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from gradzip.choices import check_choice, choices_of
from gradzip.codecs.golomb_rice import auto_k, rice_decode, rice_encode
from gradzip.compressors.base import Compressor, body_view
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.kernels.sparse import gather_values
from gradzip.keys import StreamKey
from gradzip.payload import Deferred

#: how a sparsifier's indices travel: fixed-width words, or Rice-coded gaps
SparseIndexCoding = Literal["fixed", "rice"]
INDEX_CODINGS: tuple[SparseIndexCoding, ...] = choices_of(SparseIndexCoding)
#: how a sparsifier's kept values travel
ValueCodec = Literal["fp32", "fp16", "bf16", "qsgd", "dqsg"]
VALUE_CODECS: tuple[ValueCodec, ...] = choices_of(ValueCodec)
#: the codecs whose number of levels ``value_levels`` sets (and the parameter's name there)
_LEVEL_PARAM = {"qsgd": "s", "dqsg": "M"}
_WORD = struct.Struct("<I")


def check_coding(
    index_coding: SparseIndexCoding, value_codec: ValueCodec, value_levels: int
) -> None:
    """Validate a sparsifier's coding options (see the module docstring)."""
    check_choice("index_coding", index_coding, INDEX_CODINGS)
    check_choice("value_codec", value_codec, VALUE_CODECS)
    if isinstance(value_levels, bool) or not isinstance(value_levels, int) or value_levels < 1:
        raise ValueError(f"value_levels must be an int >= 1, got {value_levels!r}")
    if value_levels != 1 and value_codec not in _LEVEL_PARAM:
        raise ValueError(
            f"value_levels applies to {sorted(_LEVEL_PARAM)} values only, not {value_codec!r}"
        )


def coding_params(index_coding: str, value_codec: str, value_levels: int) -> dict[str, str | int]:
    """The wire parameters of a non-default coding (none for the original wire, whose headers
    stay byte for byte what they were)."""
    params: dict[str, str | int] = {}
    if index_coding != "fixed":
        params["index_coding"] = index_coding
    if value_codec != "fp32":
        params["value_codec"] = value_codec
        if value_codec in _LEVEL_PARAM:
            params["value_levels"] = value_levels
    return params


def value_compressor(value_codec: str, value_levels: int) -> Compressor | None:
    """The gradzip compressor that carries the kept values (``None`` for plain float32)."""
    from gradzip.compressors.registry import create

    if value_codec == "fp32":
        return None
    if value_codec in _LEVEL_PARAM:
        return create(value_codec, bucket_size=None, **{_LEVEL_PARAM[value_codec]: value_levels})
    return create(value_codec)


# -- indices ---------------------------------------------------------------------------------
def index_gaps(idx: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``idx_j - idx_(j-1) - 1`` with ``idx_(-1) = -1``: one non-negative gap per index."""
    return np.diff(idx, prepend=np.int64(-1)) - 1


def rice_indices(idx: npt.NDArray[np.int64]) -> bytes:
    """The sorted ``idx`` as ``uint32 K`` then the Rice code words of their gaps."""
    gaps = index_gaps(idx)
    k = auto_k(gaps)
    return _WORD.pack(k) + rice_encode(gaps, k).astype("<u4").tobytes()


def parse_rice_indices(stream: memoryview, k: int, d: int, codec: str) -> npt.NDArray[np.int64]:
    """The ``k`` strictly increasing indices below ``d`` of a Rice index stream, validated."""
    if len(stream) < 8:
        raise TruncatedPayloadError(f"{codec} index stream has {len(stream)} bytes, needs 8")
    if len(stream) % 4:
        raise CorruptPayloadError(f"{codec} index stream is not whole 32-bit words")
    (rice_k,) = _WORD.unpack_from(stream, 0)
    if rice_k > 31:
        raise CorruptPayloadError(f"{codec} index stream has Rice parameter {rice_k} > 31")
    words = np.frombuffer(stream[4:], dtype="<u4").astype(np.uint32)
    gaps = rice_decode(words, rice_k)
    if gaps.size != k:
        raise CorruptPayloadError(f"{codec} index stream holds {gaps.size} indices, expected {k}")
    if k and int(gaps.max()) >= d:
        raise CorruptPayloadError(f"{codec} index gap {int(gaps.max())} is out of range (d = {d})")
    idx = np.cumsum(gaps + 1) - 1
    if k and int(idx[-1]) >= d:
        raise CorruptPayloadError(f"{codec} index {int(idx[-1])} is out of range for d = {d}")
    return idx


# -- values ----------------------------------------------------------------------------------
class ValuePart(NamedTuple):
    """The kept values' part of a body and its paper bits."""

    piece: torch.Tensor | memoryview | Deferred
    paper_bits: float


def encode_values(
    codec: Compressor | None,
    x: torch.Tensor,
    idx: torch.Tensor,
    idx_np: npt.NDArray[np.int64],
    key: StreamKey,
) -> ValuePart:
    """``x[idx]`` as float32 (gathered straight into the payload on the CPU: the original
    wire), or as a length-prefixed payload of ``codec`` keyed by ``key``."""
    k = idx_np.size
    if codec is None:
        if x.device.type == "cpu":
            src = x.numpy()
            return ValuePart(Deferred(4 * k, lambda out: gather_values(src, idx_np, out)), 32.0 * k)
        return ValuePart(x[idx], 32.0 * k)
    inner = codec.encode(x[idx].to(torch.float32).cpu(), key)
    payload = bytes(inner.payload)
    return ValuePart(memoryview(_WORD.pack(len(payload)) + payload), inner.paper_bits)


def parse_values(
    codec: Compressor | None, body: memoryview, k: int, key: StreamKey, name: str
) -> tuple[torch.Tensor, memoryview]:
    """The ``k`` float32 kept values at the start of ``body`` (a value payload: its own checks
    and key check made), and the rest of the body."""
    if codec is None:
        if len(body) < 4 * k:
            raise TruncatedPayloadError(
                f"{name} body has {len(body)} bytes; {k} values need {4 * k}"
            )
        return body_view(body[: 4 * k], torch.float32), body[4 * k :]
    if len(body) < 4:
        raise TruncatedPayloadError(f"{name} body has {len(body)} bytes, no value-payload length")
    (size,) = _WORD.unpack_from(body, 0)
    if 4 + size > len(body):
        raise TruncatedPayloadError(
            f"{name} value payload of {size} bytes does not fit the body's {len(body) - 4}"
        )
    values: torch.Tensor = codec.decode(body[4 : 4 + size], expected_key=key, shape=(k,))
    return values.to(torch.float32).contiguous(), body[4 + size :]
