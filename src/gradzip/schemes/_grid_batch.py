"""A batch of tensors on a symmetric common grid, quantized and decoded in one kernel call per
pass (:mod:`gradzip.kernels.grid_segments`) instead of several calls per tensor.

Used by :meth:`gradzip.schemes._grid_scheme.GridScheme.reduce_many_if_all_finite` where the
scheme sums a batch's codes exactly (the integer all-reduce) and the grid is a
:class:`~gradzip.compressors.grid.SymmetricGrid` (QSGD with max scales, TernGrad, unscaled
Hou). The scales, symbols, own values and means are those of the tensor-by-tensor path, bit for
bit (see the kernels' module); only the number of calls changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradzip.compressors._scaled_stochastic import decoder_steps
from gradzip.compressors.grid import SymmetricGrid
from gradzip.flat_views import adjacent_flat
from gradzip.kernels.grid_segments import (
    SegmentLayout,
    encode_segments,
    rescale_segments,
    segment_absmax,
    segment_layout,
)
from gradzip.keys import StreamKey
from gradzip.rng import derive_seed


class SegmentedBatch:
    """The tensors of one batch laid end to end: their statistics, symbols and decodes.

    ``sizes``: the live tensors' lengths, in the batch's order. Build it on every rank from the
    shapes alone (:meth:`statistics` and :meth:`zero_statistics` give the same number of
    values), so the scale message has the same length whatever this rank's flag."""

    def __init__(self, grid: SymmetricGrid, sizes: Sequence[int]) -> None:
        self.grid = grid
        self.layout: SegmentLayout = segment_layout(tuple(sizes), grid.bucket_size)
        self._x: torch.Tensor | None = None

    def statistics(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Every tensor's ``max|x_B|`` per bucket, concatenated (``xs``: flat float32, finite);
        keeps their concatenation for :meth:`symbols` (a view of ``xs`` where they lie end to
        end in one storage, which must then not change before :meth:`symbols`)."""
        # a DDP bucket's views are already laid end to end: no copy of the bucket then
        joined = adjacent_flat(xs)
        self._x = joined if joined is not None else torch.cat([x.reshape(-1) for x in xs])
        return segment_absmax(self._x, self.layout)

    def zero_statistics(self) -> torch.Tensor:
        """The statistics of a rank whose flag is down: zeros, as many as :meth:`statistics`."""
        return torch.zeros(self.layout.scale_count, dtype=torch.float32)

    def symbols(self, scales: torch.Tensor, keys: Sequence[StreamKey]) -> torch.Tensor:
        """The symbols (int32, concatenated) of the tensors given to :meth:`statistics` on the
        agreed ``scales``, tensor ``i`` under ``keys[i]``'s local stream."""
        if self._x is None:
            raise RuntimeError("SegmentedBatch.symbols needs statistics() first")
        seeds = [derive_seed(key, domain="local") for key in keys]
        g = self.grid
        codes = encode_segments(self._x, scales, self.layout, g.per, g.s, g.clip, seeds)
        self._x = None  # the concatenation is not read again: released before the sums
        return codes

    def decode(self, sums: torch.Tensor, scales: torch.Tensor, count: int) -> torch.Tensor:
        """The mean of ``count`` ranks from the int32 sum of their symbols (float32,
        concatenated): ``(sum - count s) * step / count`` with ``step = f32(f64(scale) / per)``,
        the operations and roundings of the per-tensor decode."""
        steps = (decoder_steps(scales, self.grid.per).to(torch.float64) / count).to(torch.float32)
        return rescale_segments(sums, count * self.grid.s, steps, self.layout)

    def parts(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat`` (a concatenation) cut into the tensors' flat views."""
        return [flat[a:b] for a, b in map(self.layout.segment, range(self.layout.count))]
