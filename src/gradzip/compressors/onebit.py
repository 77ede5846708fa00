"""One-bit quantization (Seide et al.), as evaluated by Dryden et al. (spec 5.1, 5.4)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from gradzip.codecs.symbols import check_packing, pack_symbols, packed_symbol_bits, unpack_symbols
from gradzip.compressors._groups import Grouping, check_group, sample_rows
from gradzip.compressors._onebit_kernels import expand_signs, pack_signs
from gradzip.compressors.base import Body, Compressor, ParamValue, body_tensor, empty_output
from gradzip.compressors.common import read_scales, symbols_floor_bits
from gradzip.compressors.registry import register
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.keys import StreamKey
from gradzip.payload import Header
from gradzip.rng import local_generator

SAMPLE_ROWS = 128


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

    References: Seide et al., "1-bit stochastic gradient descent and its application to
    data-parallel distributed training of speech DNNs", Interspeech 2014; Dryden et al.,
    "Communication Quantization for Data-parallel Training of Deep Neural Networks", MLHPC 2016.
    """

    name = "onebit"
    codec_id = 20
    checks_finite_output = True
    example_params: ClassVar[dict[str, Any]] = {}

    def __init__(self, group: str = "out", sample: bool = False, packing: str = "fixed") -> None:
        self.group = check_group(group)
        self.sample = bool(sample)
        self.packing = check_packing(packing)

    def wire_params(self) -> dict[str, ParamValue]:
        return {"group": self.group, "sample": self.sample, "packing": self.packing}

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

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        g = Grouping.of(shape, self.group)
        m = g.matrix(x)  # a view: the kernels read any strides
        cols, rows = g.groups, g.size
        # the sign stream, for the entropy accounting (and the symbol packings)
        symbols = torch.ge(m, 0).view(torch.uint8)
        if self.packing == "fixed":
            # one pass: sign bits packed into words and the positives counted per column
            packed, n_pos = pack_signs(m)
        else:
            n_pos = symbols.sum(dim=1, dtype=torch.int64).numpy()
        if self.sample and rows > SAMPLE_ROWS:
            picks = local_generator(key).integers(0, rows, size=(cols, SAMPLE_ROWS))
            stats = sample_rows(m.contiguous(), torch.from_numpy(picks))
            n_pos = np.count_nonzero((stats >= 0).numpy(), axis=1)
        else:
            stats = m
        means = self._means(stats, torch.from_numpy(np.asarray(n_pos)))
        if self.packing == "fixed":
            out = np.empty((cols, 8 + packed.shape[1]), dtype=np.uint8)
            out[:, :8] = means.numpy().view(np.uint8)
            out[:, 8:] = packed
            pieces: list[memoryview | torch.Tensor] = [out.reshape(-1).data]
        else:
            # [CHOICE] the other packings put all the means first and the symbols last
            pieces = [means, pack_symbols(symbols.reshape(-1), 2, self.packing)]
        return Body(
            pieces=pieces,
            paper_bits=float(rows * cols + 64 * cols),
            streams=(symbols,),
            side_bits=64 * cols,
        )

    @staticmethod
    def _means(stats: torch.Tensor, n_pos: torch.Tensor) -> torch.Tensor:
        """(cols, 2) float32: the means of the non-negative and of the negative entries."""
        # each sign's sum is the half-sum / half-difference of sum(V) and sum|V|, accumulated in
        # float64 (NumPy's float64 reductions are fast; torch's are not) ...
        values = stats.contiguous().numpy()
        total = torch.from_numpy(values.sum(axis=1, dtype=np.float64))
        l1 = torch.from_numpy(np.abs(values).sum(axis=1, dtype=np.float64))
        n_pos = n_pos.to(torch.float64)
        n_neg = stats.shape[1] - n_pos
        s_pos = torch.where(n_neg > 0, (total + l1) / 2, total)
        s_neg = torch.where(n_pos > 0, (total - l1) / 2, total)
        # ... which still cancels away a side below ~1e-9 of the other (e.g. [-1e30, 1e-30, 1]):
        # such columns are summed again, sign by sign
        lossy = (n_pos > 0) & (n_neg > 0) & (torch.minimum(s_pos, -s_neg) < l1 * 2.0**-20)
        if bool(lossy.any()):
            rows = lossy.nonzero().flatten()
            part = stats[rows].to(torch.float64)
            s_pos[rows] = part.clamp(min=0).sum(dim=1)
            s_neg[rows] = part.clamp(max=0).sum(dim=1)
        # an empty side has sum 0, so dividing by max(n, 1) gives the documented mean 0
        s_pos = torch.where(n_pos > 0, s_pos, 0.0)
        s_neg = torch.where(n_neg > 0, s_neg, 0.0)
        means = torch.stack((s_pos / n_pos.clamp(min=1), s_neg / n_neg.clamp(min=1)), dim=1)
        return means.to(torch.float32)

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        g = Grouping.of(header.shape, self.group)
        if self.packing == "fixed":
            means, packed = self._read_fixed(body, g.groups, g.size)
        else:
            means, positive = self._read_packed(body, g.groups, g.size)
        # every output value is one of the means: checking them checks the output
        if not bool(torch.isfinite(means).all()):
            raise CorruptPayloadError("onebit column means are not finite")
        flat = empty_output(header.numel)
        if self.packing == "fixed":
            # one pass: each column's bits select its mu+ / mu- straight into the output
            if not expand_signs(packed, means.numpy(), g.matrix(flat).numpy()):
                raise CorruptPayloadError("onebit padding bits are set")
            return flat
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
