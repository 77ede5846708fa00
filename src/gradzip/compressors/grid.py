"""The common-grid capability: quantizers whose codes several ranks can add up.

DQSG, QSGD, TernGrad, unscaled Hou and LPC all send ``level * step`` per coordinate (DQSG minus
a shared dither). If every rank uses the *same* per-bucket scale -- the maximum over ranks of
what each would have used -- the integer levels of all ranks can be summed in transit (an
integer allreduce, or a parameter server adding codes) and the receiver rebuilds the mean from
the sum: ``mean = step * (sum_p level_p - sum_p offset_p) / P``, where ``offset_p`` is rank
``p``'s dither (DQSG; regenerated from its key) or zero. The integer-sum schemes
(:mod:`gradzip.schemes.integer_allreduce`, :mod:`gradzip.schemes.server_integer_sum`) ask a
compressor for this capability with :meth:`gradzip.compressors.base.Compressor.common_grid`
and work with any compressor that provides it.

Variance: each rank's error is as for its own compressor but with the common scale
``sigma = max_p sigma_p`` in place of ``sigma_p``, so the variance of the mean is
``sum_p V_p(sigma) / P^2``, which exceeds the per-rank-scale value by the factor
``(sigma / sigma_p)^2`` for each rank (1 when the ranks' gradients have similar ranges).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from gradzip.keys import StreamKey


@dataclass(frozen=True)
class SymmetricGrid:
    """A grid whose statistic is ``max|x_B|`` per bucket of ``bucket_size`` (0: one) and whose
    symbols are :func:`gradzip.compressors._scaled_stochastic.stochastic_symbols` with ``per``,
    ``s`` and ``clip`` (``may_overload``), the local stream of the key, and decoder steps
    ``f32(f64(scale) / per)``: what the batched kernels of
    :mod:`gradzip.kernels.grid_segments` compute for many tensors in one call."""

    per: int
    s: int
    clip: bool
    bucket_size: int


class CommonGrid(Protocol):
    """Quantizing on a scale the ranks agree on; every method is required.

    All tensors are flat; ``x`` is float32 and finite. Levels are returned as symbols
    ``level + s`` in ``[0, 2s]``.
    """

    def grid_levels(self) -> int:
        """``s``: levels lie in ``[-s, s]``."""
        ...

    def grid_bucket_size(self, n: int) -> int:
        """Elements per scale for a tensor of ``n`` elements (0: one scale)."""
        ...

    def grid_prepare(self, x: torch.Tensor) -> torch.Tensor:
        """What the quantizer really encodes (e.g. after clipping); often ``x`` itself."""
        ...

    def grid_statistic(self, x: torch.Tensor) -> torch.Tensor:
        """The scale this rank alone would use, per bucket (float32); ranks agree on the max."""
        ...

    def grid_symbols(self, x: torch.Tensor, scales: torch.Tensor, key: StreamKey) -> torch.Tensor:
        """Symbols of ``x`` on the grid of the agreed ``scales`` (each ``>=`` this rank's)."""
        ...

    def grid_steps(self, scales: torch.Tensor) -> torch.Tensor:
        """The value of one level per bucket (float64), from the agreed ``scales``."""
        ...

    def grid_offsets(self, key: StreamKey, n: int) -> torch.Tensor | None:
        """What the receiver subtracts from rank ``key.rank``'s levels (float32), or None."""
        ...

    def grid_offset_seed(self, key: StreamKey) -> int | None:
        """The seed whose shared uniform stream gives :meth:`grid_offsets` as ``(1 + u) - 3/2``
        (so fused kernels regenerate the offsets tile by tile), or None: no offsets, or offsets
        of another form."""
        ...

    def grid_symmetric(self) -> SymmetricGrid | None:
        """This grid as a :class:`SymmetricGrid` (so a batch of tensors may be quantized and
        decoded in one kernel call each, with the same bits), or None: another statistic,
        symbol rule or step."""
        ...
