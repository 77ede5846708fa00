"""Adaptive quantization of Dryden et al.: per-column top-1/p of each sign (spec 5.3-5.5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from gradzip.compressors._groups import (
    Group,
    Grouping,
    IndexCoding,
    check_coding,
    check_group,
    decode_entries,
    encode_entries,
    entry_bits,
    sample_rows,
    ternary_stream,
    words_bytes,
)
from gradzip.compressors.base import Body, Compressor, ParamValue
from gradzip.compressors.registry import register
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.keys import StreamKey
from gradzip.payload import Header
from gradzip.rng import local_generator

SAMPLE_ROWS = 128


@dataclass
class _Selection:
    idx: torch.Tensor  # sorted flat indices of the sent entries
    sign: torch.Tensor  # True: sent as mu+, False: sent as mu-
    header: torch.Tensor  # (cols, 2 or 3) float32: mu+, mu-[, mu0]


@register
class Adaptive(Compressor):
    """Adaptive quantization: per column, send about 1 in ``p`` of the positive and of the
    negative entries (the largest in magnitude), each as its side's mean.

    Per column ``c`` (spec 5.3): ``Pos = {V_ic > 0}``, ``Neg = {V_ic < 0}``,
    ``n+ = max(1, floor(|Pos|/p))`` if ``|Pos| > 0`` else 0 (``n-`` likewise); ``tau+_c`` is the
    ``n+``-th largest of ``Pos`` and ``mu+_c`` the mean of the ``n+`` largest; ``tau-_c`` and
    ``mu-_c`` likewise for the ``n-`` smallest of ``Neg``. Entries ``V_ic >= tau+_c`` decode to
    ``mu+_c`` (sign 1), ``V_ic <= tau-_c`` to ``mu-_c`` (sign 0), the rest to 0. Ties at a
    threshold are all sent; with ``n+ = 0`` nothing positive is sent and ``mu+_c = 0``. Without
    ties and sampling ``nnz_c = n+ + n-`` and the sent reconstructions sum to the sent values.

    [CHOICE] Exact zeros are in neither set (an earlier draft of spec 5.3 put them in ``Pos``): they carry
    nothing, and as ``Pos`` members they would all be sent (as ``mu+``) whenever the threshold
    reaches 0, as it does on a sparse (ReLU, embedding) gradient whose column holds fewer than
    ``|Pos|/p`` positive entries: an all-zero 4096-entry tensor cost 131,464 bits that way.

    Wire: ``[mu+_c, mu-_c]`` float32 per column (plus ``mu0_c`` with ``zero_mean=True``), then
    the entries in a sparse format (see ``coding``). Body bits ``64*cols + 32*nnz`` (``96*cols``
    with ``zero_mean``) with ``coding="uint32"``; the Golomb-Rice stream of spec 5.5 otherwise.
    ``paper_bits = 64*cols + 32*nnz`` (``96*cols`` with ``zero_mean``).

    Contraction (deterministic, biased): without ties or sampling each sent set is replaced by
    its mean, so ``||V - V_hat||^2 = ||V||^2 - sum_c (n+_c mu+_c^2 + n-_c mu-_c^2) <= ||V||^2``;
    about ``2*rows/p`` entries per column are sent. Meant to run under error feedback
    (``gradzip.feedback.ErrorFeedback``), whose accumulated error telescopes (spec 0.6).

    Parameters:
        proportion: ``p >= 1``; larger ``p`` sends fewer entries (``~64/p`` bits per entry)
            but leaves more in the residual. The slides give no value: 32 is [CHOICE].
        group: ``"out"`` (default, [CODE] LBANN's per-neuron grouping: a row of
            ``V.reshape(shape[0], -1)``) or ``"in"`` (the other axis). 0-d/1-D: one column.
        sample: estimate thresholds and means from 128 rows per column drawn uniformly with
            replacement (local randomness) when rows > 128 (spec 5.4); faster on long columns,
            but the number sent is then only about ``2*rows/p``.
        zero_mean: also send ``mu0_c``, the mean of the unsent entries (of the sample when
            sampling), which the unsent entries decode to ([CODE], LBANN's later code; not in
            the slides). Costs 32 bits per column, removes each column's mean from the residual.
        coding: ``"uint32"`` (one ``(flat_index << 1) | sign`` word per entry) or
            ``"golomb_rice"`` (delta + Rice coding, spec 5.5); ``rice_k`` is 4 or ``"auto"``
            ([CHOICE]: ``K`` then travels in one uint32 word).

    References: Dryden et al., "Communication Quantization for Data-parallel Training of Deep
    Neural Networks", MLHPC 2016; LBANN ``lbann_quantizer`` (adaptive quantization).
    """

    #: the body holds the entries each group selects, as many as its values call for
    body_size_from_shape = False

    name = "adaptive"
    codec_id = 22
    example_params: ClassVar[dict[str, Any]] = {"proportion": 32}

    def __init__(
        self,
        proportion: int = 32,
        group: Group = "out",
        sample: bool = False,
        zero_mean: bool = False,
        coding: IndexCoding = "uint32",
        rice_k: int | Literal["auto"] = 4,
    ) -> None:
        if isinstance(proportion, bool) or not isinstance(proportion, int) or proportion < 1:
            raise ValueError(f"proportion must be an int >= 1, got {proportion!r}")
        self.proportion = proportion
        self.group = check_group(group)
        self.sample = bool(sample)
        self.zero_mean = bool(zero_mean)
        self.coding, self.rice_k = check_coding(coding, rice_k)

    def wire_params(self) -> dict[str, ParamValue]:
        params: dict[str, ParamValue] = {
            "proportion": self.proportion,
            "group": self.group,
            "sample": self.sample,
            "zero_mean": self.zero_mean,
            "coding": self.coding,
        }
        if self.coding == "golomb_rice":
            params["rice_k"] = self.rice_k
        return params

    @property
    def _per_column(self) -> int:
        return 3 if self.zero_mean else 2

    def min_body_bits(self, header: Header) -> int:
        # the column means (the entries may be none: an all-zero tensor sends no entry)
        return 32 * self._per_column * Grouping.of(header.shape, self.group).groups

    def expected_body_bits(self, x: torch.Tensor, key: StreamKey | None = None) -> int:
        """Body bits for ``x``; with ``sample=True`` they depend on ``key`` (default key)."""
        flat = x.detach().reshape(-1).to(device="cpu", dtype=torch.float32)
        sel = self._select(flat, tuple(x.shape), key if key is not None else StreamKey())
        g = Grouping.of(tuple(x.shape), self.group)
        return 32 * self._per_column * g.groups + entry_bits(
            sel.idx, sel.sign, self.coding, self.rice_k
        )

    # -- selection (spec 5.3) -------------------------------------------------------------------
    def _select(self, x: torch.Tensor, shape: tuple[int, ...], key: StreamKey) -> _Selection:
        g = Grouping.of(shape, self.group)
        m = g.matrix(x)
        # row selection is several times faster on contiguous rows ("in" groups are strided)
        stats = m if self.sample else m.contiguous()
        if self.sample and g.size > SAMPLE_ROWS:
            picks = local_generator(key).integers(0, g.size, size=(g.groups, SAMPLE_ROWS))
            stats = sample_rows(m, torch.from_numpy(picks))
        s = stats.numpy()
        # [CHOICE] exact zeros belong to neither side (spec 5.3 counts them as positive)
        n_pos = self._top_count(np.count_nonzero(s > 0, axis=1))
        n_neg = self._top_count(np.count_nonzero(s < 0, axis=1))
        tau_pos, mu_pos = _side_stats(_extremes(s, int(n_pos.max()), largest=True), n_pos, np.inf)
        tau_neg, mu_neg = _side_stats(_extremes(s, int(n_neg.max()), largest=False), n_neg, -np.inf)
        a = x.numpy().reshape(g.a, g.b)
        pos = a >= g.broadcast(torch.from_numpy(tau_pos)).numpy()
        sent = a <= g.broadcast(torch.from_numpy(tau_neg)).numpy()
        sent |= pos
        idx = np.flatnonzero(sent)
        sign = pos.reshape(-1)[idx]
        columns = [mu_pos, mu_neg]
        if self.zero_mean:
            columns.append(_unsent_mean(s, tau_pos, tau_neg))
        header = torch.from_numpy(np.stack(columns, axis=1).astype(np.float32))
        return _Selection(torch.from_numpy(idx), torch.from_numpy(sign), header)

    def _top_count(self, count: np.ndarray) -> np.ndarray:
        """``n = max(1, floor(count/p))`` where ``count > 0``, else 0 (spec 5.3)."""
        return np.where(count > 0, np.maximum(count // self.proportion, 1), 0)

    # -- wire -----------------------------------------------------------------------------------
    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        sel = self._select(x, shape, key)
        words = encode_entries(sel.idx, sel.sign, self.coding, self.rice_k)
        cols = sel.header.shape[0]
        n_pos = int(np.count_nonzero(sel.sign.numpy()))
        nnz = sel.idx.numel()
        # the ternary symbols' (unsent, mu-, mu+) n*H: the entropy bound of the sparse pattern
        symbols = ternary_stream(x.numel(), nnz - n_pos, n_pos)
        side_bits = 32 * self._per_column * cols
        return Body(
            pieces=[sel.header, words_bytes(words)],
            paper_bits=float(side_bits + 32 * nnz),
            streams=(symbols,),
            side_bits=side_bits,
        )

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        g = Grouping.of(header.shape, self.group)
        head_bytes = 4 * self._per_column * g.groups
        if len(body) < head_bytes:
            raise TruncatedPayloadError(
                f"adaptive body has {len(body)} bytes; its column means need {head_bytes}"
            )
        means = torch.from_numpy(
            np.frombuffer(body[:head_bytes], dtype="<f4").reshape(g.groups, -1).copy()
        )
        if not bool(torch.isfinite(means).all()):
            raise CorruptPayloadError("adaptive column means are not finite")
        idx, sign = decode_entries(body[head_bytes:], header.numel, self.coding, self.rice_k)
        if self.zero_mean:
            out = g.broadcast(means[:, 2]).expand(g.a, g.b).reshape(-1).clone()
        else:
            out = torch.zeros(header.numel, dtype=torch.float32)
        column = g.group_of(idx)
        out[idx] = torch.where(sign, means[column, 0], means[column, 1])
        return out


def _extremes(s: np.ndarray, k: int, *, largest: bool) -> np.ndarray:
    """The ``k`` largest (descending) or smallest (ascending) entries of each row of ``s``.

    ``np.partition`` selects them in linear time per row (a full sort or ``torch.topk`` of a
    long row costs several times more); only the ``k`` selected values are then sorted.
    """
    rows = s.shape[1]
    if k == 0:
        return np.empty((s.shape[0], 0), dtype=s.dtype)
    if largest:
        top = np.partition(s, rows - k, axis=1)[:, rows - k :]
        return -np.sort(-top, axis=1)
    return np.sort(np.partition(s, k - 1, axis=1)[:, :k], axis=1)


def _side_stats(top: np.ndarray, n: np.ndarray, empty_tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Per column: the ``n``-th most extreme value (the threshold; ``empty_tau`` where ``n = 0``,
    so nothing of that sign is sent) and the float64 mean of the ``n`` most extreme (0 if none).
    """
    cols = n.shape[0]
    if top.shape[1] == 0:
        return np.full(cols, empty_tau, dtype=np.float32), np.zeros(cols)
    last = np.maximum(n - 1, 0).reshape(-1, 1)
    tau = np.take_along_axis(top, last, axis=1)[:, 0]
    tau = np.where(n > 0, tau, np.float32(empty_tau)).astype(np.float32)
    sums = np.take_along_axis(np.cumsum(top, axis=1, dtype=np.float64), last, axis=1)[:, 0]
    return tau, np.where(n > 0, sums / np.maximum(n, 1), 0.0)


def _unsent_mean(s: np.ndarray, tau_pos: np.ndarray, tau_neg: np.ndarray) -> np.ndarray:
    """Per column float64 mean of the entries of ``s`` that are not sent (0 if none)."""
    unsent = (s < tau_pos.reshape(-1, 1)) & (s > tau_neg.reshape(-1, 1))
    total = np.where(unsent, s, np.float32(0)).sum(axis=1, dtype=np.float64)
    mean: np.ndarray = total / np.maximum(np.count_nonzero(unsent, axis=1), 1)
    return mean
