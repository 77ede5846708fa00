"""Threshold quantization (Strom), as evaluated by Dryden et al. (spec 5.2, 5.5)."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from gradzip.compressors._groups import (
    IndexCoding,
    check_coding,
    decode_entries,
    encode_entries,
    entry_bits,
    ternary_stream,
    words_bytes,
)
from gradzip.compressors.base import Body, Compressor, ParamValue
from gradzip.compressors.registry import register
from gradzip.keys import StreamKey
from gradzip.payload import Header

_FLOAT32_MAX = float(np.finfo(np.float32).max)


@register
class Threshold(Compressor):
    """Threshold quantization: send only the entries with ``|V_i| >= tau``, as ``+-tau``.

    ``V_i >= tau`` is sent with sign bit 1 and decodes to ``+tau``; ``V_i <= -tau`` with sign bit
    0 and decodes to ``-tau``; every other entry decodes to 0 (under error feedback it stays in
    the residual whole). ``tau`` is used as its float32 value, both for the comparison and for the
    reconstruction. No statistic is sent.

    Bits: ``32*nnz`` with the default ``coding="uint32"`` (one little-endian uint32
    ``(flat_index << 1) | sign`` per sent entry, sorted by index; flat indices must be below
    ``2**31``, else ``ValueError``); with ``coding="golomb_rice"`` the delta + Golomb-Rice stream
    of spec 5.5, ``32*max(1, ceil(sum_j (q_j + 1 + K)/32))`` (plus 32 for the ``K`` word when
    ``rice_k="auto"``, [CHOICE]). ``paper_bits = 32*nnz`` either way.

    Contraction (deterministic, biased): ``||V - V_hat||^2 = sum_unsent V_i^2 +
    sum_sent (|V_i| - tau)^2 <= ||V||^2 - nnz*tau^2``. Every unsent entry of the residual is
    below ``tau`` in magnitude; under error feedback the accumulated error telescopes
    (spec 0.6).

    Parameters:
        tau: the fixed threshold (> 0, required), chosen in advance for the data's scale: too
            small sends nearly everything (``32`` bits per entry), too large sends nothing and
            leaves error feedback to carry the whole update.
        coding: ``"uint32"`` (slides' 31-bit index + 1-bit value) or ``"golomb_rice"``
            (LBANN's delta + Rice coding, far fewer bits on sparse outputs).
        rice_k: Rice parameter ``K`` in ``[0, 31]`` (4, LBANN's default) or ``"auto"``.

    References: Strom, "Scalable distributed DNN training using commodity GPU cloud computing",
    Interspeech 2015; Dryden et al., "Communication Quantization for Data-parallel Training of
    Deep Neural Networks", MLHPC 2016.
    """

    #: the body holds the entries above a threshold, as many as the values have
    body_size_from_shape = False

    name = "threshold"
    codec_id = 21
    example_params: ClassVar[dict[str, Any]] = {"tau": 1e-3}

    def __init__(
        self, tau: float, coding: IndexCoding = "uint32", rice_k: int | Literal["auto"] = 4
    ) -> None:
        tau = float(tau)
        if not (math.isfinite(tau) and 0 < tau <= _FLOAT32_MAX) or np.float32(tau) == 0:
            raise ValueError(f"tau must be a positive float32 value, got {tau!r}")
        self.tau = tau
        self.coding, self.rice_k = check_coding(coding, rice_k)

    def wire_params(self) -> dict[str, ParamValue]:
        params: dict[str, ParamValue] = {"tau": self.tau, "coding": self.coding}
        if self.coding == "golomb_rice":
            params["rice_k"] = self.rice_k
        return params

    def _select(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sorted flat indices of the sent entries and their signs (True: positive)."""
        tau = np.float32(self.tau)
        v = x.numpy()
        pos = v >= tau
        sent = v <= -tau
        sent |= pos
        idx = np.flatnonzero(sent)
        return torch.from_numpy(idx), torch.from_numpy(pos[idx])

    def min_body_bits(self, header: Header) -> int:
        # no entry at all when nothing reaches tau; only the K word of rice_k="auto"
        return 32 if self.coding == "golomb_rice" and self.rice_k == "auto" else 0

    def expected_body_bits(self, x: torch.Tensor) -> int:
        flat = x.detach().reshape(-1).to(device="cpu", dtype=torch.float32)
        return entry_bits(*self._select(flat), self.coding, self.rice_k)

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        idx, sign = self._select(x)
        words = encode_entries(idx, sign, self.coding, self.rice_k)
        n_pos = int(np.count_nonzero(sign.numpy()))
        # the ternary symbols' (unsent, -tau, +tau) n*H: the entropy bound of the sparse pattern
        symbols = ternary_stream(x.numel(), idx.numel() - n_pos, n_pos)
        return Body(
            pieces=[words_bytes(words)],
            paper_bits=32.0 * idx.numel(),
            streams=(symbols,),
            side_bits=0,
        )

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        idx, sign = decode_entries(body, header.numel, self.coding, self.rice_k)
        tau = np.float32(self.tau)
        out = np.zeros(header.numel, dtype=np.float32)  # NumPy memory: few page faults
        out[idx.numpy()] = np.where(sign.numpy(), tau, -tau)
        return torch.from_numpy(out)
