"""``gradzip tune``'s link measurement: alpha and beta of the default process group.

All-gathers of float32 tensors of a few sizes (1 to 64 MB a rank by default), each timed as the
slowest rank's best of ``repeat`` after a barrier, are fitted by least squares to the ring
all-gather's cost ``(P-1) x (alpha + bytes / beta)`` (:mod:`gradzip_lab.bench.project_links`):
alpha is the intercept of the time a round against a round's bytes, beta the inverse slope.
[CHOICE] The all-gather, not the all-reduce, because it is the collective whose cost has no
reduction arithmetic in it; the all-reduce of the largest size is timed too and printed as a
check, and an all-to-all of the same bytes to each peer as the largest all-gather, whose rate
over the all-gather's is the link's all-to-all efficiency (the transport sends the integer
sums' reduce-scatter, and by default its gathers, as all-to-alls; on a rate-limited link their
``P - 1`` flows at once can lose packets to each other). [CHOICE] Sizes stop growing once the
next one would take more than ``budget_s`` seconds (its time predicted from the last size's, in
proportion to the bytes: :func:`next_size_fits`), so a slow link still finishes in well under a
minute; at least two sizes are always timed.
(The first version stopped only once a size had taken more than the budget: with eight ranks
at 1 Gbit/s on the project's two cores that timed 64 MB all-gathers of 4.2 s, three times.)
[CHOICE] A link faster than the sizes can resolve (a loaded host, localhost, small sizes) can
give times that do not grow with bytes: rather than fail, the fit then takes alpha as 0 and the
rate as the best throughput any size showed, a lower bound on the link's, and says so
(``rate_is_lower_bound``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

DEFAULT_SIZES_MB: tuple[float, ...] = (1, 4, 16, 64)


@dataclass(frozen=True)
class LinkEstimate:
    """The fitted link: seconds a message, raw Gbit/s (payload rate over the wire efficiency
    of the model's links), and the figures behind them."""

    alpha_s: float
    gbit_per_s: float
    world_size: int
    points: tuple[tuple[float, float], ...]  # (bytes a round, seconds a round)
    allreduce_gbit_per_s: float
    rate_is_lower_bound: bool = False
    #: the all-to-all's byte rate over the all-gather's, the same bytes (the largest size
    #: timed): what the model's :class:`~gradzip_lab.bench.project_links.Link` prices the
    #: transport's all-to-alls at (capped at 1 there)
    alltoall_efficiency: float = 1.0

    def check(self) -> None:
        if not (math.isfinite(self.alpha_s) and self.alpha_s >= 0):
            raise ValueError(f"measured alpha is not a finite number >= 0: {self.alpha_s}")
        if not (math.isfinite(self.gbit_per_s) and self.gbit_per_s > 0):
            raise ValueError(f"measured link rate is not finite and > 0: {self.gbit_per_s}")
        if not (math.isfinite(self.alltoall_efficiency) and self.alltoall_efficiency > 0):
            raise ValueError(
                f"measured all-to-all efficiency is not finite and > 0: {self.alltoall_efficiency}"
            )


def slowest_seconds(fn: Callable[[], object]) -> float:
    """``fn``'s seconds on the slowest rank of the default group, timed from a barrier (every
    rank calls this and gets the same figure)."""
    dist.barrier()
    start = time.perf_counter()
    fn()
    t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _time(fn: Callable[[], object], repeat: int) -> float:
    """The best of ``repeat`` :func:`slowest_seconds` of ``fn``."""
    return min(slowest_seconds(fn) for _ in range(repeat))


def _least_squares(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of ``seconds`` against ``bytes``; ``ValueError`` with fewer than two
    distinct sizes."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("fitting alpha and beta needs at least two message sizes")
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    var = sum((b - mean_b) ** 2 for b, _ in points)
    slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / var
    return mean_t - slope * mean_b, slope


def fit_alpha_beta(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least squares of ``seconds = alpha + bytes / beta`` over (bytes, seconds) points:
    (alpha, beta in bytes a second). ``ValueError`` when the points cannot give a positive
    slope (fewer than two sizes, or times that do not grow with bytes)."""
    intercept, slope = _least_squares(points)
    if not slope > 0:
        raise ValueError(f"collective times do not grow with bytes (slope {slope:g} s/B)")
    return max(0.0, intercept), 1.0 / slope  # [CHOICE] a negative intercept is noise: 0


def fit_or_bound(points: Sequence[tuple[float, float]]) -> tuple[float, float, bool]:
    """:func:`fit_alpha_beta`, or, when the times do not grow with bytes, alpha 0 and the best
    throughput of any point (a lower bound on the rate): (alpha, beta, beta is a bound)."""
    intercept, slope = _least_squares(points)
    if slope > 0:
        return max(0.0, intercept), 1.0 / slope, False
    if not all(t > 0 for _, t in points):
        raise ValueError(f"a collective timed at zero or fewer seconds: {list(points)}")
    return 0.0, max(b / t for b, t in points), True


def next_size_fits(seconds: float, size_mb: float, next_mb: float, budget_s: float) -> bool:
    """Whether a collective of ``next_mb`` is predicted to take at most ``budget_s``, given that
    one of ``size_mb`` took ``seconds`` (in proportion to the bytes: an upper bound where alpha
    counts for something)."""
    return seconds * next_mb / size_mb <= budget_s


def measure_link(
    sizes_mb: Sequence[float] = DEFAULT_SIZES_MB,
    repeat: int = 3,
    budget_s: float = 2.0,
    efficiency: float = 1448 / 1514,
) -> LinkEstimate:
    """Time all-gathers over the default process group (every rank calls this) and fit the
    link; every rank returns the same estimate (the slowest rank's times)."""
    if not dist.is_initialized():
        raise ValueError("measure_link needs torch.distributed initialised (run under torchrun)")
    p = dist.get_world_size()
    if p < 2:
        raise ValueError("measuring a link needs at least 2 ranks")
    points: list[tuple[float, float]] = []
    last = None
    for number, mb in enumerate(sizes_mb):
        numel = max(1, int(mb * 1e6 / 4))
        x = torch.ones(numel)
        outs = [torch.empty(numel) for _ in range(p)]
        seconds = _time(partial(dist.all_gather, outs, x), repeat)
        points.append((4.0 * numel, seconds / (p - 1)))
        last = x
        more = sizes_mb[number + 1 :]
        if len(points) >= 2 and more and not next_size_fits(seconds, mb, more[0], budget_s):
            break
    alpha, beta, bound = fit_or_bound(points)
    assert last is not None
    reduced = last.clone()
    ar_s = _time(lambda: dist.all_reduce(reduced), 1)
    ar_bytes = 2 * (p - 1) / p * 4 * last.numel()
    # the same bytes to each peer as the largest all-gather, in one all-to-all
    outgoing = last.repeat(p)
    incoming = torch.empty_like(outgoing)
    a2a_s = _time(lambda: dist.all_to_all_single(incoming, outgoing), repeat)
    gather_s = points[-1][1] * (p - 1)
    estimate = LinkEstimate(
        alpha_s=alpha,
        gbit_per_s=beta * 8 / 1e9 / efficiency,
        world_size=p,
        points=tuple(points),
        allreduce_gbit_per_s=ar_bytes / ar_s * 8 / 1e9 / efficiency,
        rate_is_lower_bound=bound,
        alltoall_efficiency=gather_s / a2a_s,
    )
    estimate.check()
    return estimate
