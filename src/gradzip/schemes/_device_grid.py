"""Device twins of the compressors' common grid (:class:`gradzip.compressors.grid.CommonGrid`).

The integer-sum schemes quantize on an agreed scale through the compressor's ``grid_*``
methods, which compute on the host (numba kernels, ``float(...)`` reads). A :class:`DeviceGrid`
gives the same values on the gradient's device with the device kernels the codecs' own device
paths use (:mod:`gradzip.kernels.dithered_device`, :mod:`gradzip.kernels.stochastic_device`):
the same formulas and order of IEEE operations, so the symbols, scales, steps and dithers equal
the host's bit for bit, and nothing is read back.

[CHOICE] The twins live here, beside the schemes, rather than as methods of each compressor:
the compressors stay as they are, and :func:`device_grid` names exactly the configurations
that have one (DQSG; QSGD, TernGrad and Hou with max-abs scales and no clipping). LPC (its
step ``delta`` is a host function of the scale) and the others keep the host path.
"""

from __future__ import annotations

from typing import Protocol

import torch

from gradzip.compressors.base import Compressor
from gradzip.kernels.device_buckets import bucket_absmax_device, per_element
from gradzip.kernels.device_division import divided
from gradzip.keys import StreamKey


class DeviceGrid(Protocol):
    """The device half of a common grid: what the scheme computes per call on the device."""

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """``grid_prepare`` (float32, flat, on the device)."""
        ...

    def statistic(self, x: torch.Tensor) -> torch.Tensor:
        """``grid_statistic``: this rank's scale per bucket (float32; NaN for NaN input)."""
        ...

    def symbols(self, x: torch.Tensor, scales: torch.Tensor, key: StreamKey) -> torch.Tensor:
        """``grid_symbols`` (integers in ``[0, 2s]``)."""
        ...

    def steps(self, scales: torch.Tensor) -> torch.Tensor:
        """``grid_steps`` (float64)."""
        ...

    def offsets(self, key: StreamKey, n: int, device: torch.device) -> torch.Tensor | None:
        """``grid_offsets`` (float32) or None."""
        ...


class _DQSGGrid:
    """DQSG's grid: max-abs scales (after optional clipping), dithered symbols, shared dither
    offsets ``(1 + u01) - 3/2``."""

    def __init__(self, codec: Compressor) -> None:
        from gradzip.compressors.dqsg import DQSG

        assert isinstance(codec, DQSG)
        self.codec = codec

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        from gradzip.compressors.dqsg import clip_to_std_device
        from gradzip.kernels.device_buckets import single_absmax

        c = self.codec.clip_std
        if c is None or x.numel() == 0:
            return x
        return clip_to_std_device(x, single_absmax(x), c)[0]

    def statistic(self, x: torch.Tensor) -> torch.Tensor:
        return bucket_absmax_device(x, self.codec.bucket_size_for(x.numel()))

    def symbols(self, x: torch.Tensor, scales: torch.Tensor, key: StreamKey) -> torch.Tensor:
        from gradzip.compressors.dqsg import _encode_args
        from gradzip.kernels.dithered_device import encode_symbols_device

        args = _encode_args(self.codec.M, self.codec.seed_schedule.shared_seed(key))
        return encode_symbols_device(x, scales, self.codec.bucket_size_for(x.numel()), **args)

    def steps(self, scales: torch.Tensor) -> torch.Tensor:
        return divided(scales.to(torch.float64), float(self.codec.M))

    def offsets(self, key: StreamKey, n: int, device: torch.device) -> torch.Tensor | None:
        from gradzip.kernels.philox import SHARED_UNIFORM
        from gradzip.kernels.philox_torch import one_plus_uniform_device

        seed = self.codec.seed_schedule.shared_seed(key)
        return one_plus_uniform_device(seed, SHARED_UNIFORM, n, device) - 1.5


class _StochasticGrid:
    """QSGD/TernGrad/Hou's grid: max-abs scales, stochastic rounding, no offsets."""

    def __init__(self, codec: Compressor) -> None:
        from gradzip.compressors._scaled_stochastic import ScaledStochastic

        assert isinstance(codec, ScaledStochastic)
        self.codec = codec

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def statistic(self, x: torch.Tensor) -> torch.Tensor:
        return bucket_absmax_device(x, self.codec._bucket)

    def symbols(self, x: torch.Tensor, scales: torch.Tensor, key: StreamKey) -> torch.Tensor:
        from gradzip.kernels.stochastic_device import symmetric_symbols_device
        from gradzip.rng import derive_seed

        s = self.codec.s
        seed = derive_seed(key, domain="local")
        return symmetric_symbols_device(x, scales, self.codec._bucket, s, s, False, seed)

    def steps(self, scales: torch.Tensor) -> torch.Tensor:
        from gradzip.kernels.stochastic_device import safe_steps_device

        return safe_steps_device(scales, self.codec.s).to(torch.float64)

    def offsets(self, key: StreamKey, n: int, device: torch.device) -> torch.Tensor | None:
        return None


def device_grid(codec: Compressor) -> DeviceGrid | None:
    """The device twin of ``codec``'s common grid, or None where it has none (see the
    module): the scheme then quantizes on the host."""
    from gradzip.compressors._scaled_stochastic import ScaledStochastic
    from gradzip.compressors.dqsg import DQSG

    if codec.common_grid() is None:
        return None
    if isinstance(codec, DQSG):
        return _DQSGGrid(codec)
    if (
        isinstance(codec, ScaledStochastic)
        and codec._max_abs_scales()
        and getattr(codec, "clip_sigma", None) is None
    ):
        return _StochasticGrid(codec)
    return None


def net_levels_device(
    grid: DeviceGrid, sums: torch.Tensor, keys: list[StreamKey], s: int, wide: bool
) -> torch.Tensor:
    """:meth:`~gradzip.schemes._grid_scheme.GridScheme._net_levels` on the device: the same
    dtype choice (``wide``: float64) and order of subtractions."""
    n = sums.numel()
    levels = sums.to(torch.float64 if wide else torch.float32) - len(keys) * s
    for key in keys:
        offsets = grid.offsets(key, n, sums.device)
        if offsets is not None:
            levels = levels - offsets
    return levels


def values_device(
    grid: DeviceGrid, levels: torch.Tensor, scales: torch.Tensor, count: int, bucket_size: int
) -> torch.Tensor:
    """:meth:`~gradzip.schemes._grid_scheme.GridScheme._values` on the device (a true division
    by ``count`` on the device)."""
    steps = divided(grid.steps(scales), float(count)).to(levels.dtype)
    return levels * per_element(steps, levels.numel(), bucket_size)
