"""``gradzip reproduce``: the seed papers' tables and figures, recomputed with this library.

Each experiment id maps to a function ``run(out_dir, quick) -> Outcome``; :func:`reproduce`
runs one and writes ``<out>/<id>/report.md`` (the paper's value, ours, the deviation) and
``<out>/<id>/result.json``, plus ``accuracy.png`` for the curves.

Experiments whose ``run`` also takes ``seed`` (default 0) can be repeated over seeds
(``reproduce(..., seeds=[0, 1, 2])``, ``gradzip reproduce ID --seeds 3``): each seed's run
goes to ``<out>/<id>/seed-<seed>/`` and ``<out>/<id>/`` gets the mean ± sd of every row and
the paired tests of the module's ``COMPARISONS`` (:mod:`.seeds`).
"""

from __future__ import annotations

import importlib
import inspect
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from gradzip.data import DatasetUnavailableError
from gradzip_lab.reproduce.outcome import Outcome, write_outcome
from gradzip_lab.reproduce.seeds import (
    Comparison,
    SeededOutcome,
    aggregate,
    read_outcome,
    write_seeded,
)


@dataclass(frozen=True)
class Experiment:
    """One reproducible table or figure: its id, a one-line summary and the rough ``--quick``
    wall time on 2 cores. The id names the module whose ``run(out, quick)`` computes it
    (imported only when the experiment runs): ``<paper>-<name>`` is ``<paper>/<name>.py`` of
    this package, e.g. ``dqsg-table1`` is ``gradzip_lab.reproduce.dqsg.table1``."""

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

    def _import(self) -> ModuleType:
        return importlib.import_module(f"{__name__}.{self.module}")

    def takes_seed(self) -> bool:
        """Whether the module's ``run`` takes a ``seed`` (can be repeated over seeds)."""
        return "seed" in inspect.signature(self._import().run).parameters

    def comparisons(self) -> tuple[Comparison, ...]:
        """The method comparisons a multi-seed run tests (the module's ``COMPARISONS``)."""
        found: tuple[Comparison, ...] = getattr(self._import(), "COMPARISONS", ())
        return found

    def run(self, out: Path, quick: bool, seed: int | None = None) -> Outcome:
        """The module's ``run``; ``seed=None`` calls it without one (its own default)."""
        module = self._import()
        if seed is None:
            outcome: Outcome = module.run(out, quick)
        elif self.takes_seed():
            outcome = module.run(out, quick, seed=seed)
        else:
            raise ValueError(f"{self.id} takes no seed")
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


def reproduce(
    experiment_id: str, out: str | Path, quick: bool = False, seeds: Sequence[int] | None = None
) -> Outcome | SeededOutcome:
    """Run ``experiment_id`` and write its report under ``out/<id>/``; the outcome.

    ``seeds`` (at least one, for an experiment whose ``run`` takes a seed; ``ValueError``
    otherwise, before anything runs) runs it once per seed into ``out/<id>/seed-<seed>/`` and
    writes their mean ± sd and tests to ``out/<id>/``; the result is then a
    :class:`SeededOutcome`. ``DatasetUnavailableError`` (a data set the user must supply is
    missing) propagates, and the directories this call created are removed again. An
    experiment that needs root raises
    :class:`~gradzip_lab.reproduce.timing_setup.ClusterUnavailableError` before
    creating anything where the emulated cluster cannot be built."""
    if experiment_id not in EXPERIMENTS:
        raise KeyError(experiment_id)
    experiment = EXPERIMENTS[experiment_id]
    if seeds is not None:
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct and at least one, not {list(seeds)}")
        if not experiment.takes_seed():
            raise ValueError(f"{experiment_id} takes no seed: run it without --seeds")
    if experiment.needs_root:
        from gradzip_lab.reproduce.timing_setup import require_cluster

        require_cluster(experiment_id)
    directory = Path(out) / experiment_id
    created = _outermost_missing(directory)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        if seeds is None:
            outcome = _run_once(experiment, directory, quick, None)
            write_outcome(outcome, directory)
            return outcome
        outcomes = []
        for seed in seeds:
            outcomes.append(_run_once(experiment, directory / f"seed-{seed}", quick, seed))
            if len(outcomes) == 1:  # a comparison naming no row fails now, not after all seeds
                aggregate(outcomes, [seed], experiment.comparisons())
    except DatasetUnavailableError:
        # a data set the user must supply is missing: leave no empty report directory behind
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    seeded = aggregate(outcomes, list(seeds), experiment.comparisons())
    write_seeded(seeded, directory)
    return seeded


def _run_once(experiment: Experiment, directory: Path, quick: bool, seed: int | None) -> Outcome:
    """One run, timed; a seed's run also writes its own report into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    outcome = experiment.run(directory, quick, seed)
    outcome.seconds = time.perf_counter() - started
    if seed is not None:
        write_outcome(outcome, directory)
    return outcome


def summarize_seeds(experiment_id: str, directory: str | Path) -> SeededOutcome:
    """Fold the seed runs stored in ``directory/seed-<seed>/result.json`` (as a multi-seed
    ``reproduce`` leaves them) into a new ``directory/report.md`` and ``result.json``, with
    the experiment's current ``COMPARISONS``: seeds run separately are summarized in one."""
    directory = Path(directory)
    found = sorted(
        (int(p.parent.name.removeprefix("seed-")), p) for p in directory.glob("seed-*/result.json")
    )
    if not found:
        raise FileNotFoundError(f"no seed-<seed>/result.json under {directory}")
    outcomes = [read_outcome(path) for _, path in found]
    seeded = aggregate(
        outcomes, [seed for seed, _ in found], EXPERIMENTS[experiment_id].comparisons()
    )
    write_seeded(seeded, directory)
    return seeded


def _outermost_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist yet (None if it does)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            break
        missing = p
    return missing
