"""Common machinery of the schemes that add integer codes quantized on an agreed scale."""

from __future__ import annotations

from abc import abstractmethod

import torch

from gradzip.comm.transport import Transport, in_step_scope
from gradzip.compressors.base import Compressor
from gradzip.compressors.buckets import per_element
from gradzip.compressors.grid import CommonGrid
from gradzip.device.mode import device_path
from gradzip.errors import NonFiniteInputError
from gradzip.feedback import working_dtype
from gradzip.kernels.grid_sums import mean_from_sums
from gradzip.keys import StreamKey
from gradzip.schemes._device_grid import DeviceGrid, device_grid
from gradzip.schemes._device_messages import Checks
from gradzip.schemes.base import Scheme

#: the largest integer up to which every integer is exact in float32
FLOAT32_EXACT = 2**24
#: code sums must stay below this: they are int32 and packed at up to 31 bits
MAX_SUM = 2**31


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
            x = self.grid.grid_prepare(v.detach().reshape(-1).to("cpu", torch.float32))
            if n and not bool(torch.isfinite(x).all()):
                raise NonFiniteInputError(
                    f"{self.compressor.name}: cannot encode a tensor holding NaN or Inf; nothing "
                    "was updated"
                )
            scales = self._agree(transport, self.grid.grid_statistic(x), step, tensor_index)
            symbols = self.grid.grid_symbols(x, scales, own_key)
            own = torch.empty(0)
            if feedback is not None:
                own = self._values(self._net_levels(symbols, [own_key]), scales)
                own = own.view(v.shape).to(v.dtype)
            return (symbols, scales), own

        if n == 0:
            return torch.zeros(tensor.shape, dtype=working_dtype(tensor.dtype))
        if feedback is not None:
            symbols, scales = feedback.compensate(tensor, own_key, quantize)
        else:
            (symbols, scales), _ = quantize(tensor)
        mean = self._mean(transport, symbols, scales, step, tensor_index)
        return mean.view(tensor.shape).to(working_dtype(tensor.dtype))

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
        """The mean of ranks ``0 .. count-1`` from the sum of their symbols (float32).

        A float32 sum goes through one fused pass (:func:`~gradzip.kernels.grid_sums.
        mean_from_sums`: the dithers regenerated tile by tile, the steps read per bucket), the
        same bits as :meth:`_net_levels` then :meth:`_values`; wide sums and grids whose offsets
        have no seed take those two."""
        keys = [self.key(p, step, tensor_index) for p in range(count)]
        s = self.grid.grid_levels()
        seeds = [self.grid.grid_offset_seed(key) for key in keys]
        has_offsets = self.grid.grid_offsets(keys[0], 0) is not None if keys else False
        fused = sums.dtype == torch.float32 and 2 * s * count <= FLOAT32_EXACT
        if fused and (not has_offsets or all(seed is not None for seed in seeds)):
            steps = (self.grid.grid_steps(scales) / count).to(torch.float32)
            offsets = [seed for seed in seeds if seed is not None] if has_offsets else []
            n = sums.numel()
            return mean_from_sums(sums, count * s, offsets, steps, self.grid.grid_bucket_size(n))
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
