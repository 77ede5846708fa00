"""Common machinery of the schemes that add integer codes quantized on an agreed scale."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gradzip.comm.transport import Transport, in_step_scope
from gradzip.compressors.base import Compressor, empty_output
from gradzip.compressors.buckets import per_element
from gradzip.compressors.grid import CommonGrid
from gradzip.device.mode import device_path
from gradzip.errors import NonFiniteInputError
from gradzip.feedback import ErrorFeedback, Slot, working_dtype
from gradzip.finite import all_finite
from gradzip.kernels.backend import use_torch_ops
from gradzip.kernels.grid_sums import SUM_DTYPES, mean_from_sums
from gradzip.keys import StreamKey
from gradzip.schemes._device_grid import DeviceGrid, device_grid
from gradzip.schemes._device_messages import Checks
from gradzip.schemes._grid_batch import SegmentedBatch
from gradzip.schemes.base import Scheme

#: the largest integer up to which every integer is exact in float32
FLOAT32_EXACT = 2**24
#: code sums must stay below this: they are int32 and packed at up to 31 bits
MAX_SUM = 2**31


@dataclass
class _Prepared:
    """One tensor of a batch before any message: its values on the grid's terms (``x``, float32,
    flat), and with error feedback its residual slot and compensated values ``v = g + e`` (the
    residual is committed from ``v`` only once the batch has succeeded)."""

    x: torch.Tensor
    slot: Slot | None = None
    v: torch.Tensor | None = None


class GridScheme(Scheme):
    """Quantize every rank's tensor on a common scale, let the subclass sum the integer symbols,
    and rebuild the mean ``step * (sum_p level_p - sum_p offset_p) / P`` on every rank.

    Subclasses implement :meth:`_agree` (the element-wise max of the ranks' scale statistics)
    and :meth:`_mean` (how the integer sums travel, usually ending in :meth:`_decode_sum`). Error feedback (role ``"worker"``)
    keeps ``v - v_hat_own`` where ``v_hat_own`` is this rank's own contribution on the common
    grid.
    """

    @classmethod
    def check_compatible(cls, compressor: Compressor) -> None:
        super().check_compatible(compressor)
        if compressor.common_grid() is None:
            raise ValueError(
                f"{compressor.name} does not send integer levels on a scale the ranks can share "
                "(supported: dqsg, qsgd, terngrad, lpc, unscaled hou); the allgather, ps and "
                "ring schemes take any compressor"
            )

    @property
    def grid(self) -> CommonGrid:
        """The compressor's common grid (:meth:`check_compatible` made sure it has one)."""
        grid = self.compressor.common_grid()
        assert grid is not None
        return grid

    @in_step_scope
    def reduce(
        self, transport: Transport, tensor: torch.Tensor, step: int, tensor_index: int = 0
    ) -> torch.Tensor:
        self.check_sum_range(transport.world_size)
        twin = device_grid(self.compressor) if self.device_capable else None
        if twin is not None and device_path(tensor):
            from gradzip.schemes._device_grid_reduce import reduce_on_device

            return reduce_on_device(self, twin, transport, tensor, step, tensor_index)
        n = tensor.numel()
        own_key = self.key(transport.rank, step, tensor_index)
        feedback = self.feedback.get("worker")

        def quantize(v: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
            x = self._prepare(v)
            if not all_finite([x]):
                raise NonFiniteInputError(
                    f"{self.compressor.name}: cannot encode a tensor holding NaN or Inf; nothing "
                    "was updated"
                )
            scales = self._agree(transport, self.grid.grid_statistic(x), step, tensor_index)
            symbols = self.grid.grid_symbols(x, scales, own_key)
            own = torch.empty(0)
            if feedback is not None:
                own = self._own_values(symbols, scales, own_key, v)
            return (symbols, scales), own

        if n == 0:
            return torch.zeros(tensor.shape, dtype=working_dtype(tensor.dtype))
        if feedback is not None:
            symbols, scales = feedback.compensate(tensor, own_key, quantize)
        else:
            (symbols, scales), _ = quantize(tensor)
        mean = self._mean(transport, symbols, scales, step, tensor_index)
        return mean.view(tensor.shape).to(working_dtype(tensor.dtype))

    @in_step_scope
    def reduce_many_if_all_finite(
        self,
        transport: Transport,
        tensors: Sequence[torch.Tensor],
        indices: Sequence[int],
        step: int,
        finite: bool,
    ) -> tuple[list[torch.Tensor], list[int]]:
        """The means of ``tensors`` with ONE scale agreement and, where the subclass sums
        exactly (:meth:`_means_of_batch`), ONE code sum for the whole batch, instead of one of
        each per tensor (latency: a DDP bucket of ``k`` parameters costs the rounds of one
        tensor, not of ``k``).

        1. Every tensor is compensated (error feedback, its own residual slot) and prepared on
           the grid; this rank's flag is ``finite`` and every prepared value finite.
        2. One :meth:`_agree` (the scale all-gather of ``allreduce``, the max ring of
           ``ring_allreduce``; messages keyed by ``indices[0]``) over the concatenation of every
           tensor's statistic and ``P`` flag floats: float ``r`` is 1.0 when rank ``r``'s flag
           is down, else 0.0, and a rank whose flag is down sends zeros as statistics, so the
           element-wise maximum gives every rank the scales and the ranks that are down. When
           any is, every rank returns ``([], down)`` with nothing sent after the agreement and
           nothing updated (the residuals untouched).
        3. Every tensor's symbols on its own scales under its own key (``key(rank, step,
           indices[i])``), summed and decoded by :meth:`_means_of_batch`, or, where
           :meth:`_segmented` allows, quantized, summed and decoded as one concatenation
           (:mod:`gradzip.schemes._grid_batch`, the same bits).
        4. Only then the residuals ``v - v_hat_own`` of every tensor.

        Bytes: one scale message (or max ring) for the batch, carrying the statistics of every
        tensor plus ``4 P`` bytes of flags, in place of one per tensor and a separate flag
        all-gather (:meth:`~gradzip.schemes.base.Scheme.reduce_if_all_finite`); the codes as
        :meth:`_means_of_batch` sends them. Bits: each tensor's scales are the maximum of its
        own statistics (a maximum is exact), its symbols and keys are those of :meth:`reduce`,
        so with an exact code sum every mean is bit-identical to reducing the tensors one by
        one, whatever the grouping (:attr:`~gradzip.schemes.base.Scheme.groups_exactly` holds);
        the residuals too. Variance: that of :meth:`reduce`, per tensor.

        An empty tensor's mean is zeros and sends nothing (as in :meth:`reduce`). Tensors that
        :meth:`reduce` would reduce on their device go through the base class's one-by-one
        path (:mod:`gradzip.schemes._device_grid_reduce`)."""
        if len(tensors) != len(indices) or not tensors:
            raise ValueError(
                f"reduce_many_if_all_finite needs at least one tensor and one index per tensor, "
                f"got {len(tensors)} tensors and {len(indices)} indices"
            )
        twin = device_grid(self.compressor) if self.device_capable else None
        if twin is not None and any(device_path(t) for t in tensors):
            return super().reduce_many_if_all_finite(transport, tensors, indices, step, finite)
        self.check_sum_range(transport.world_size)
        size, rank = transport.world_size, transport.rank
        live = [i for i, t in enumerate(tensors) if t.numel()]
        keys = {i: self.key(rank, step, indices[i]) for i in live}
        batch = self._segmented([tensors[i].numel() for i in live], size)
        prepared: dict[int, _Prepared] = {}
        if finite:
            feedback = self.feedback.get("worker")
            into = self._compensation_views(batch, feedback, [tensors[i] for i in live])
            for k, i in enumerate(live):
                prepared[i] = self._prepare_compensated(
                    feedback, tensors[i], keys[i], into[k] if into else None
                )
            finite = all_finite([p.x for p in prepared.values()])
        if batch is not None:
            statistics = [
                batch.statistics([prepared[i].x for i in live])
                if finite
                else batch.zero_statistics()
            ]
        else:
            statistics = [
                self.grid.grid_statistic(prepared[i].x)
                if finite
                else self.grid.grid_statistic(torch.zeros(tensors[i].numel()))  # zeros, its size
                for i in live
            ]
        flags = torch.zeros(size, dtype=torch.float32)
        flags[rank] = 0.0 if finite else 1.0
        message = torch.cat([*(s.to(torch.float32).reshape(-1) for s in statistics), flags])
        agreed = self._agree(transport, message, step, indices[0])
        down = [r for r in range(size) if float(agreed[len(agreed) - size + r]) > 0.0]
        if down:
            return [], down
        feedback = self.feedback.get("worker")
        live_indices = [indices[i] for i in live]
        own: list[torch.Tensor] = []  # with error feedback: each live tensor's own values
        if batch is not None:
            scales_flat = agreed[: len(agreed) - size]
            codes = batch.symbols(scales_flat, [keys[i] for i in live])
            # this rank's own values before the sum: the ring sums into ``codes``
            if feedback is not None:
                own = batch.parts(batch.decode(codes, scales_flat, 1))
            sums = self._sum_batch_codes(transport, codes, step, live_indices[0])
            means_of_live = batch.parts(batch.decode(sums, scales_flat, size))
        else:
            scales = list(
                torch.split(agreed[: len(agreed) - size], [s.numel() for s in statistics])
            )
            symbols = [
                self.grid.grid_symbols(prepared[i].x, sc, keys[i])
                for i, sc in zip(live, scales, strict=True)
            ]
            means_of_live = self._means_of_batch(transport, symbols, scales, step, live_indices)
            if feedback is not None:
                own = [
                    self._own_values(sym, sc, keys[i], prepared[i].x)
                    for i, sym, sc in zip(live, symbols, scales, strict=True)
                ]
        # zeros only for the empty tensors: a live tensor's mean replaces its slot (a zero-filled
        # placeholder of every gradient cost a full pass over the bucket each step)
        of_live = dict(zip(live, means_of_live, strict=True))
        means = [
            of_live[i].view(t.shape).to(working_dtype(t.dtype))
            if i in of_live
            else torch.zeros(t.shape, dtype=working_dtype(t.dtype))
            for i, t in enumerate(tensors)
        ]
        # the residuals change only now, after every message of the batch has succeeded
        if feedback is not None:
            for i, own_flat in zip(live, own, strict=True):
                p = prepared[i]
                assert p.slot is not None and p.v is not None
                feedback.commit(p.slot, p.v, own_flat.view(p.v.shape).to(p.v.dtype))
        return means, []

    def _segmented(self, sizes: list[int], world_size: int) -> SegmentedBatch | None:
        """The batch of ``sizes`` as one :class:`~gradzip.schemes._grid_batch.SegmentedBatch`
        where its kernels give this scheme's bits: an exact code sum (:attr:`sums_exactly`), a
        symmetric grid, the numba kernels (not forced torch operations) and sums exact in
        float32. Decided from the shapes and the configuration alone, so alike on every rank."""
        symmetric = self.grid.grid_symmetric()
        if (
            not self.sums_exactly
            or symmetric is None
            or use_torch_ops()
            or 2 * symmetric.s * world_size > FLOAT32_EXACT
        ):
            return None
        return SegmentedBatch(symmetric, sizes)

    def _sum_batch_codes(
        self, transport: Transport, codes: torch.Tensor, step: int, first_index: int
    ) -> torch.Tensor:
        """The element-wise sum over ranks of a batch's concatenated codes (int32, summed into
        ``codes``), messages keyed by the batch's first tensor index: only for a scheme whose
        sums are exact (:attr:`sums_exactly`)."""
        raise NotImplementedError(f"{self.name} does not sum a batch's codes in one message")

    #: whether a batch's codes may be summed concatenated (:meth:`_sum_batch_codes`) with the
    #: same bits as tensor by tensor: exact integer sums (the integer all-reduce)
    sums_exactly = False

    def _means_of_batch(
        self,
        transport: Transport,
        symbols: list[torch.Tensor],
        scales: list[torch.Tensor],
        step: int,
        indices: list[int],
    ) -> list[torch.Tensor]:
        """The means (float32, flat) of a batch's tensors from their symbols and agreed
        scales. This default sums each tensor's codes on its own (:meth:`_mean`, the bits of
        :meth:`reduce`); a subclass whose code sums are exact sends them in one sum."""
        return [
            self._mean(transport, sym, sc, step, index)
            for sym, sc, index in zip(symbols, scales, indices, strict=True)
        ]

    def _prepare(self, v: torch.Tensor) -> torch.Tensor:
        """``v`` on the grid's terms: flat float32 on the CPU, clipped where the codec clips."""
        return self.grid.grid_prepare(v.detach().reshape(-1).to("cpu", torch.float32))

    def _prepare_compensated(
        self,
        feedback: ErrorFeedback | None,
        tensor: torch.Tensor,
        key: StreamKey,
        out: torch.Tensor | None = None,
    ) -> _Prepared:
        """One tensor of a batch, compensated by its residual (not yet updated, ``v`` written
        into ``out`` where given) and prepared."""
        if feedback is None:
            return _Prepared(self._prepare(tensor))
        slot, v = feedback.compensated(tensor, key, out)
        return _Prepared(self._prepare(v), slot, v)

    @staticmethod
    def _compensation_views(
        batch: SegmentedBatch | None, feedback: ErrorFeedback | None, tensors: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """With error feedback on a segmented batch of float32 gradients: views of one
        concatenation for the compensated values, so the batch quantizes them in place instead
        of copying them end to end (a pass over the whole batch); else none."""
        if (
            batch is None
            or feedback is None
            or any(working_dtype(t.dtype) != torch.float32 for t in tensors)
        ):
            return []
        return batch.parts(empty_output(batch.layout.total, torch.float32))

    def _own_values(
        self, symbols: torch.Tensor, scales: torch.Tensor, key: StreamKey, v: torch.Tensor
    ) -> torch.Tensor:
        """This rank's own contribution on the common grid (``v_hat_own``, shaped and typed as
        ``v``): what error feedback subtracts from ``v``. The decode of a one-rank sum (the
        fused pass where it applies: the same bits as :meth:`_net_levels` then :meth:`_values`)."""
        return self._decode_levels(symbols, scales, [key], 1).view(v.shape).to(v.dtype)

    def check_sum_range(self, world_size: int) -> None:
        """Refuse a group whose code sums could overflow: the sums of ``P`` ranks' symbols reach
        ``2 s P`` and travel as int32 (packed at up to 31 bits). Every rank raises the same
        ``ValueError`` before sending anything (e.g. ``lpc`` with ``b = 24`` on more than 128
        ranks)."""
        top = 2 * self.grid.grid_levels() * world_size
        if top >= MAX_SUM:
            raise ValueError(
                f"{self.name}: the sum of {world_size} ranks' {self.compressor.describe()} codes "
                f"reaches {top}, beyond the int32 code sums of this scheme (at most "
                f"{MAX_SUM - 1}); use fewer bits, fewer ranks or the allgather scheme"
            )

    def _decode_sum(
        self, sums: torch.Tensor, scales: torch.Tensor, step: int, tensor_index: int, count: int
    ) -> torch.Tensor:
        """The mean of ranks ``0 .. count-1`` from the sum of their symbols (float32)."""
        keys = [self.key(p, step, tensor_index) for p in range(count)]
        return self._decode_levels(sums, scales, keys, count)

    def _decode_levels(
        self, sums: torch.Tensor, scales: torch.Tensor, keys: list[StreamKey], count: int
    ) -> torch.Tensor:
        """``step * (sums - count s - sum_p offset_p) / count`` (float32) for the ranks of
        ``keys``: the mean of ``count`` ranks from their symbol sum (the rank itself alone for
        error feedback's own values).

        Sums of float32, int32 (the integer all-reduce's) or uint8 (one rank's symbols) go
        through one fused pass (:func:`~gradzip.kernels.grid_sums.mean_from_sums`: converted
        per element, the dithers regenerated tile by tile, the steps read per bucket), the same
        bits as :meth:`_net_levels` then :meth:`_values`; wide sums and grids whose offsets
        have no seed take those two. [CHOICE] The offsets' seeds are asked for only where the
        grid has offsets: this runs per tensor and step, and a small model's dozens of tensors
        made its fixed costs the price."""
        s = self.grid.grid_levels()
        fused = sums.dtype in SUM_DTYPES and 2 * s * count <= FLOAT32_EXACT
        if fused and keys:
            has_offsets = self.grid.grid_offsets(keys[0], 0) is not None
            seeds = [self.grid.grid_offset_seed(key) for key in keys] if has_offsets else []
            if all(seed is not None for seed in seeds):
                steps = (self.grid.grid_steps(scales) / count).to(torch.float32)
                offsets = [seed for seed in seeds if seed is not None]
                n = sums.numel()
                return mean_from_sums(
                    sums, count * s, offsets, steps, self.grid.grid_bucket_size(n)
                )
        return self._values(self._net_levels(sums, keys), scales, count)

    def _net_levels(self, sums: torch.Tensor, keys: list[StreamKey]) -> torch.Tensor:
        """``sum_p (level_p - offset_p)`` over the ranks of ``keys`` from their symbol sum.

        float32 [CHOICE] while the sums stay below ``2**24`` (exact integers in float32): the
        dithers add a rounding of about ``P * 2**-24`` levels, far below the quantization
        error. Wider sums (``lpc`` with ``b`` above about 20) are formed in float64, where they
        are exact too. Every rank runs the same operations in the same order, so all get the
        same bits.
        """
        n = sums.numel()
        s = self.grid.grid_levels()
        dtype = torch.float32 if 2 * s * len(keys) <= FLOAT32_EXACT else torch.float64
        levels = sums.to(dtype).sub_(len(keys) * s)
        for key in keys:
            offsets = self.grid.grid_offsets(key, n)
            if offsets is not None:
                levels.sub_(offsets)
        return levels

    def _values(self, levels: torch.Tensor, scales: torch.Tensor, count: int = 1) -> torch.Tensor:
        """``levels * step / count`` per element (in place, in ``levels``' dtype: float32, or
        float64 for wide sums, see :meth:`_net_levels`)."""
        n = levels.numel()
        steps = (self.grid.grid_steps(scales) / count).to(levels.dtype)
        return levels.mul_(per_element(steps, n, self.grid.grid_bucket_size(n)))

    #: whether the subclass implements :meth:`_agree_device` and :meth:`_mean_device`
    device_capable = False

    def _agree_device(
        self,
        transport: Transport,
        statistic: torch.Tensor,
        step: int,
        tensor_index: int,
        checks: Checks,
    ) -> torch.Tensor:
        """:meth:`_agree` with device messages, their flags into ``checks``."""
        raise NotImplementedError(f"{self.name} has no device path")

    def _mean_device(
        self,
        grid: DeviceGrid,
        transport: Transport,
        symbols: torch.Tensor,
        scales: torch.Tensor,
        step: int,
        tensor_index: int,
        checks: Checks,
    ) -> torch.Tensor:
        """:meth:`_mean` with device messages, their flags into ``checks``."""
        raise NotImplementedError(f"{self.name} has no device path")

    @abstractmethod
    def _agree(
        self, transport: Transport, statistic: torch.Tensor, step: int, tensor_index: int
    ) -> torch.Tensor:
        """The element-wise maximum over ranks of ``statistic`` (float32), on every rank."""

    @abstractmethod
    def _mean(
        self,
        transport: Transport,
        symbols: torch.Tensor,
        scales: torch.Tensor,
        step: int,
        tensor_index: int,
    ) -> torch.Tensor:
        """Exchange the ranks' symbols (integers in ``[0, 2s]``) and return the mean (float32,
        flat), bit-identical on every rank."""
