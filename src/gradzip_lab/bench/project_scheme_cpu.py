"""The CPU time one rank spends in a scheme's own code, measured by running the scheme.

A scheme does more than its compressor's encode and decode. The integer all-reduce agrees on
the scales, quantizes on them, packs a slice for each peer, unpacks and adds the peers' slices,
packs the sums and unpacks every rank's sums: composing that from the compressor's per
coordinate speeds under-counted it 5-6x on mlp-4096 (the model said 16 ms of a rank's CPU a
step at P = 8, a run of the scheme 105 ms). The all-gather frames its payload, checks and
decodes every rank's and averages them: 2-2.5x its composed encode and P decodes at P = 2
and 4. So the model times the scheme itself (the integer all-reduce, the all-gather and the
nested all-gather):
``world_size`` ranks in this process (threads over the in-process transport, so no wire and no
socket), each reducing one tensor of ``numel`` values as the DDP hook hands it a bucket
(``reduce_many_if_all_finite``), each rank's CPU seconds (``time.thread_time``: its own thread's,
whatever the other threads take of the cores) the best of ``repeat`` after one untimed call,
averaged over the ranks and divided by ``numel``.

[CHOICE] At most :data:`MAX_RANKS` ranks (the integer all-reduce's work a rank per coordinate
changes little past them: each rank still quantizes its whole tensor once and decodes the sums
once, the slices only get thinner; the all-gather decodes one more payload a rank, which the
model adds at the codec's decode speed), and the codec threads at the caller's setting (one, as the projection runs). What
it leaves out: the transport's framing of real sockets and gloo's own threads (they copy the
same bytes), and the DDP hook's hand-off to its stage thread.
"""

from __future__ import annotations

import statistics
import time

import torch

from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.schemes.spec import ExchangeSpec

#: the most ranks the scheme is run with (see the module docstring)
MAX_RANKS = 8


def scheme_cpu_s_per_coord(
    spec_text: str, world_size: int, numel: int = 1 << 21, repeat: int = 3
) -> float:
    """CPU seconds a coordinate one rank spends in ``spec_text``'s reduce of one tensor at
    ``min(world_size, MAX_RANKS)`` ranks (see the module docstring)."""
    if world_size < 2 or numel < 1 or repeat < 1:
        raise ValueError(
            f"timing a scheme needs world_size >= 2, numel >= 1 and repeat >= 1, got "
            f"{world_size}, {numel}, {repeat}"
        )
    spec = ExchangeSpec.parse(spec_text)
    ranks = min(world_size, MAX_RANKS)

    def one_rank(transport: Transport) -> float:
        scheme = spec.build(run_seed=2024)
        gen = torch.Generator().manual_seed(transport.rank)
        tensor = torch.randn(numel, generator=gen)
        best = float("inf")
        for step in range(repeat + 1):
            start = time.thread_time()
            scheme.reduce_many_if_all_finite(transport, [tensor], [0], step, True)
            if step > 0:  # the first call builds buffers and kernels
                best = min(best, time.thread_time() - start)
        return best

    return statistics.fmean(run_local(ranks, one_rank, timeout=600.0)) / numel
