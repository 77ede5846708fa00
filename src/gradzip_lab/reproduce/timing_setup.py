"""What the timing reproductions share: the refusal without root, and the notes every report
carries about how its figures were taken.

They time real exchanges of real payloads on the emulated cluster of ``gradzip bench cluster``
(:func:`gradzip_lab.bench.cluster_timing.measure_exchanges`), which needs root and iproute2;
:func:`gradzip_lab.reproduce.reproduce` refuses them beforehand with
:class:`ClusterUnavailableError` (the command line prints its one line and exits 2).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gradzip.errors import GradzipError
from gradzip_lab.bench.cluster_netns import missing_privilege
from gradzip_lab.bench.timing import best_time


class ClusterUnavailableError(GradzipError):
    """The emulated cluster cannot be built here (not root, or iproute2 missing)."""


def require_cluster(experiment_id: str) -> None:
    """Raise :class:`ClusterUnavailableError` naming what ``gradzip reproduce ID`` needs."""
    reason = missing_privilege()
    if reason:
        raise ClusterUnavailableError(f"{experiment_id} {reason}")


def method_notes(rate: str, world_sizes: str) -> list[str]:
    """The notes on the measurement itself, the same in every timing report."""
    return [
        f"Measured on the emulated cluster of `gradzip bench cluster`: one network namespace "
        f"per rank ({world_sizes}), veth links through a bridge, every link limited to {rate} "
        "in both directions by tc tbf; the ranks exchange the real payloads over gloo.",
        f"All ranks run on this machine's {os.cpu_count()} cores, shared with other work (load "
        f"average {os.getloadavg()[0]:.1f} over the last minute of the run): "
        "absolute times are noisy, so the compared variants run interleaved (each step, every "
        "variant in turn, after a barrier) and the report gives RATIOS, each the median over "
        "steps of the two variants' times in the same step.",
        "A step's time is the stated computation plus the exchange's time on its slowest "
        "rank, timed from a barrier. The computation is not run (real forward and backward "
        "passes of several ranks would queue on the shared cores, which no cluster does); "
        "encoding and decoding are real work on the shared cores, so they cost more here "
        "than on a node of its own.",
    ]


def one_thread_seconds(work: Callable[[], object], repeat: int = 3) -> float:
    """The fastest of ``repeat`` runs of ``work`` on one thread (after a warm-up): the compute
    time of a step, measured on this machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds, _ = best_time(work, repeat)
    finally:
        torch.set_num_threads(threads)
    return seconds
