"""``gradzip reproduce``: the seed papers' tables and figures, recomputed with this library.

Each experiment id maps to a function ``run(out_dir, quick) -> Outcome``; :func:`reproduce`
runs one and writes ``<out>/<id>/report.md`` (the paper's value, ours, the deviation) and
``<out>/<id>/result.json``, plus ``accuracy.png`` for the curves.
"""

from __future__ import annotations

import importlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from gradzip.data import DatasetUnavailableError
from gradzip.experiments.reproduce.common import Outcome, write_outcome


@dataclass(frozen=True)
class Experiment:
    """One reproducible table or figure: its id, a one-line summary and the rough ``--quick``
    wall time on 2 cores. The id names the module whose ``run(out, quick)`` computes it
    (imported only when the experiment runs): ``<paper>-<name>`` is ``<paper>/<name>.py`` of
    this package, e.g. ``dqsg-table1`` is ``gradzip.experiments.reproduce.dqsg.table1``."""

    id: str
    summary: str
    quick_seconds: int
    #: times exchanges on the emulated cluster: needs root and iproute2 (refused otherwise)
    needs_root: bool = False

    @property
    def module(self) -> str:
        """The dotted path of the id's module, relative to this package (``dqsg.table1``)."""
        paper, _, name = self.id.partition("-")
        return f"{paper}.{name.replace('-', '_')}"

    def run(self, out: Path, quick: bool) -> Outcome:
        module = importlib.import_module(f"{__name__}.{self.module}")
        outcome: Outcome = module.run(out, quick)
        return outcome


_TABLE = (
    # seed 000: DQSG / NDQSG (Abdi & Fekri)
    Experiment("dqsg-table1", "DQSG Table 1: raw Kbit per worker per iteration", 5),
    Experiment("dqsg-table2", "DQSG Table 2: entropy Kbit per worker, 32 workers", 40),
    Experiment("dqsg-table3", "DQSG Table 3: CifarNet accuracy (needs CIFAR-10)", 190),
    Experiment("dqsg-fig4", "DQSG Figure 4: final accuracy vs workers, MNIST", 25),
    Experiment("dqsg-fig5", "DQSG Figure 5: NDQSG vs DQSG M=2 vs baseline, FC-300-100", 45),
    # seed 001: QESGD
    Experiment("qesgd-table1", "QESGD Table 1: SGD/QSGD/QESGD (needs CIFAR-10)", 35),
    Experiment("qesgd-fmnist", "QESGD Table 1 setting on Fashion-MNIST, ResNet-20", 30),
    Experiment("qesgd-lstm", "QESGD RNN figure: 2-layer char LSTM on pydoc text", 15),
    Experiment("qesgd-table2", "QESGD Table 2: bits per epoch, parameter server", 5),
    # seed 002: LPC-SVRG / ALPC-SVRG
    Experiment("lpc-fig3a", "LPC-SVRG Fig. 3(a): loss vs rounds, bits; Syn-512", 20),
    Experiment("lpc-fig3b", "LPC-SVRG Fig. 3(b): loss vs rounds, bits; Syn-1024", 30),
    Experiment("lpc-fig3c", "LPC-SVRG Fig. 3(c): Syn-20k with clipping", 15),
    Experiment("lpc-clipping", "LPC-SVRG: clipping vs error and loss, Syn-20k", 10),
    Experiment("lpc-table2", "LPC-SVRG Table 2: bits to a loss, YearMSD", 10),
    # seed 003: DQGAN
    Experiment("dqgan-bilinear", "DQGAN: OMD vs GDA, EF with top-k, bilinear game", 5),
    Experiment("dqgan-mixture", "DQGAN vs CPOAdam(-GQ): 2-D Gaussian-mixture WGAN", 20),
    Experiment("dqgan-mnist", "DQGAN vs CPOAdam(-GQ): MNIST DCGAN, Frechet distance", 15),
    # seed 004: Dryden et al.
    Experiment("dryden-accuracy", "Dryden et al.: MNIST accuracy of four quantizers", 30),
    Experiment("dryden-volume", "Dryden et al.: data volume per mini-batch", 35),
    # the seeds' timing results, on the emulated cluster (network namespaces, tc tbf)
    Experiment("dryden-allreduce", "Dryden et al.: quantized vs fp32 all-reduce time", 40, True),
    Experiment("qesgd-speedup", "QESGD Table 2: speed-up over SGD, parameter server", 55, True),
    Experiment("dqgan-speedup", "DQGAN Fig. 4: speed-up vs number of workers", 50, True),
    Experiment("lpc-timesplit", "LPC-SVRG Fig. 4: computation vs communication time", 20, True),
)
EXPERIMENTS: dict[str, Experiment] = {e.id: e for e in _TABLE}


def reproduce(experiment_id: str, out: str | Path, quick: bool = False) -> Outcome:
    """Run ``experiment_id`` and write its report under ``out/<id>/``; the outcome.

    ``DatasetUnavailableError`` (a data set the user must supply is missing) propagates, and
    the directories this call created are removed again. An experiment that needs root raises
    :class:`~gradzip.experiments.reproduce.cluster_timing.ClusterUnavailableError` before
    creating anything where the emulated cluster cannot be built."""
    if experiment_id not in EXPERIMENTS:
        raise KeyError(experiment_id)
    if EXPERIMENTS[experiment_id].needs_root:
        from gradzip.experiments.reproduce.cluster_timing import require_cluster

        require_cluster(experiment_id)
    directory = Path(out) / experiment_id
    created = _outermost_missing(directory)
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        outcome = EXPERIMENTS[experiment_id].run(directory, quick)
    except DatasetUnavailableError:
        # a data set the user must supply is missing: leave no empty report directory behind
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    outcome.seconds = time.perf_counter() - started
    write_outcome(outcome, directory)
    return outcome


def _outermost_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist yet (None if it does)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            break
        missing = p
    return missing
