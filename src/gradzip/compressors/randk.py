"""rand-k: keep k coordinates chosen by shared randomness, so no index is sent."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from numpy.typing import NDArray

from gradzip.compressors._decode_guards import check_finite_output
from gradzip.compressors._device_sparse import (
    decode_values_device,
    encode_values_device,
    false_flag,
    values_on_device,
    values_size,
)
from gradzip.compressors._sparse_coding import (
    ValueCodec,
    check_coding,
    coding_params,
    encode_values,
    parse_values,
    value_compressor,
)
from gradzip.compressors.base import Body, ParamValue
from gradzip.compressors.registry import register
from gradzip.compressors.topk import KeptValues, check_k_ratio, kept_count
from gradzip.device.ops import host_array
from gradzip.errors import CorruptPayloadError
from gradzip.kernels.random_subset import random_subset
from gradzip.keys import StreamKey
from gradzip.payload import Header
from gradzip.rng import shared_words

_F32_MAX = float(torch.finfo(torch.float32).max)


def randk_indices_device(key: StreamKey, d: int, k: int, device: torch.device) -> torch.Tensor:
    """:func:`randk_indices` as an int64 tensor on ``device``: drawn on the host from the key
    alone and sent there (a host-to-device copy, no read of the gradient)."""
    if k >= d:
        return torch.arange(d, dtype=torch.int64, device=device)
    return host_array(randk_indices(key, d, k), device)


def randk_indices(key: StreamKey, d: int, k: int) -> NDArray[np.int64]:
    """The sorted indices rand-k keeps for ``key``: sender and receiver regenerate them alike."""
    if k >= d:
        return np.arange(d, dtype=np.int64)
    words = shared_words(key)
    if 2 * k <= d:
        return random_subset(words, d, k)
    # keep most coordinates: draw the smaller set of dropped ones instead
    keep = np.ones(d, dtype=np.bool_)
    keep[random_subset(words, d, d - k)] = False
    return np.flatnonzero(keep)


@register
class RandK(KeptValues):
    """rand-k sparsification: keep ``k`` coordinates drawn uniformly without replacement.

    The indices come from the shared randomness of the message's :class:`StreamKey`
    (``gradzip.rng.shared_words``), so the receiver regenerates them and only the ``k``
    values travel; every step, rank and tensor gets a fresh subset.

    Wire: the ``k`` kept values as float32, in increasing index order. Body bits: ``32 k``;
    paper bits the same.

    Bounds, for a uniform k-subset (each coordinate kept with probability ``k/d``):

    * ``scaled=False`` (default): ``C(x) = x`` on the subset, 0 elsewhere. Biased, and
      delta-approximate with ``delta = k/d``: ``E||C(x) - x||^2 = (1 - k/d) ||x||^2``.
    * ``scaled=True``: the kept values are multiplied by ``d/k`` on decode. Unbiased,
      ``E C(x) = x``, with variance ``E||C(x) - x||^2 = (d/k - 1) ||x||^2``. [CHOICE] A kept
      value above ``k/d`` times float32's maximum cannot be represented after scaling: it
      decodes to float32's largest finite value of its sign (saturation, as fp16 does).

    Parameters (exactly one of ``k``, ``ratio``, as for top-k): smaller ``k`` sends fewer bits but
    keeps less (unscaled) or adds variance (scaled). Versus top-k it saves the
    ``ceil(log2 d)`` index bits per value but keeps random rather than the largest coordinates.

    [CHOICE] The subset is drawn from the raw shared word stream with integer arithmetic only,
    so it is the same on every platform and NumPy version.

    Device resident with ``value_codec`` ``"fp32"``, ``"fp16"`` or ``"bf16"``: a tensor not on
    the CPU is gathered on its device into the host path's exact bytes, and a device payload
    decodes there. [CHOICE] The subset is drawn on the host (its rejection loop is sequential
    and depends on the key alone) and its ``k`` indices are copied to the device: nothing is
    read back, but that copy is ``8 k`` bytes per message each way the payload is coded.
    ``"qsgd"`` / ``"dqsg"`` value payloads stay on the host.

    References: Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory" (NeurIPS 2018); Wangni et
    al., "Gradient Sparsification for Communication-Efficient Distributed Optimization" (2018).
    """

    name = "randk"
    codec_id = 31
    uses_shared_randomness = True
    checks_finite_output = True  # the kept values are checked, not the whole output
    example_params: ClassVar[dict[str, Any]] = {"ratio": 0.1}

    def __init__(
        self,
        k: int | None = None,
        ratio: float | None = None,
        scaled: bool = False,
        value_codec: ValueCodec = "fp32",
        value_levels: int = 1,
    ) -> None:
        self.k, self.ratio = check_k_ratio(k, ratio)
        if not isinstance(scaled, bool):
            raise ValueError(f"scaled must be a bool, got {scaled!r}")
        self.scaled = scaled
        check_coding("fixed", value_codec, value_levels)
        self.value_codec, self.value_levels = value_codec, value_levels
        self._values = value_compressor(value_codec, value_levels)

    def wire_params(self) -> dict[str, ParamValue]:
        params: dict[str, ParamValue] = {"k": self.k, "ratio": self.ratio, "scaled": self.scaled}
        params.update(coding_params("fixed", self.value_codec, self.value_levels))
        return params

    @property
    def device_resident(self) -> bool:  # type: ignore[override]
        """True for float32, fp16 or bf16 values (see the class docstring)."""
        return values_on_device(self._values)

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        d = x.numel()
        k = kept_count(self.k, self.ratio, d)
        idx = randk_indices_device(key, d, k, x.device)
        values = encode_values_device(self._values, x, idx, key)
        piece = values.piece
        return Body(pieces=[piece], paper_bits=values.paper_bits, side_bits=8 * piece.nbytes)

    def _kept_device(
        self, body: torch.Tensor, header: Header
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d = header.numel
        k = kept_count(self.k, self.ratio, d)
        device = body.device
        idx = randk_indices_device(header.key, d, k, device)
        if body.numel() != values_size(self._values, k, header.key):  # the host names it
            return idx, torch.zeros(k, dtype=torch.float32, device=device), false_flag(device)
        values, ok = decode_values_device(self._values, body, k, header.key)
        if self.scaled and k < d:
            # as the host path: one float64 product, saturated, rounded once to float32
            wide = values.to(torch.float64) * (d / k)
            values = wide.clamp(-_F32_MAX, _F32_MAX).to(torch.float32)
        valid = torch.ones((), dtype=torch.bool, device=device) if ok is None else ok
        return idx, values, valid

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        d = x.numel()
        k = kept_count(self.k, self.ratio, d)
        idx = randk_indices(key, d, k)
        values = encode_values(self._values, x, torch.from_numpy(idx).to(x.device), idx, key)
        piece = values.piece
        return Body(pieces=[piece], paper_bits=values.paper_bits, side_bits=8 * piece.nbytes)

    def _kept(self, body: memoryview, header: Header) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept ``(indices, float32 values)`` of a body (exact size checked; scaled and
        saturated when ``scaled``) and checked finite, as :meth:`decode` checks its output."""
        d = header.numel
        k = kept_count(self.k, self.ratio, d)
        values, rest = parse_values(self._values, body, k, header.key, self.name)
        if len(rest):
            raise CorruptPayloadError(
                f"randk body has {len(body)} bytes, expected {len(body) - len(rest)}"
            )
        if self.scaled and k < d:
            # saturate: a kept value above k/d times float32's maximum is sent legitimately,
            # and a decoded Inf would be refused as corrupt
            values = values.to(torch.float64).mul_(d / k).clamp_(-_F32_MAX, _F32_MAX)
            values = values.to(torch.float32)
        check_finite_output(self.name, values)
        return torch.from_numpy(randk_indices(header.key, d, k)), values

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        """``32 k`` for float32 values; None for a value payload (its header's size varies)."""
        if self._values is not None:
            return None
        return 32 * kept_count(self.k, self.ratio, x.numel())

    def min_body_bits(self, header: Header) -> int:
        if self._values is not None:
            return 32  # the value payload's length word
        return 32 * kept_count(self.k, self.ratio, header.numel)
