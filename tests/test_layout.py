"""Where things are: the qesgd package exports its algorithm, and a reproduction's module is
named by its id. That the library never imports the application is
tests/test_architecture.py's business."""

from __future__ import annotations

from pathlib import Path

import gradzip
from gradzip.experiments.reproduce import EXPERIMENTS

SRC = Path(gradzip.__file__).parent


def test_the_qesgd_package_exports_what_the_module_did() -> None:
    from gradzip.algorithms import qesgd
    from gradzip.algorithms.qesgd.algorithm import QESGDOptimizer

    assert qesgd.QESGDOptimizer is QESGDOptimizer
    assert "QESGDOptimizer" in qesgd.__all__


def test_a_reproduction_module_is_named_by_its_experiment_id() -> None:
    assert EXPERIMENTS["dqsg-table1"].module == "dqsg.table1"
    assert EXPERIMENTS["dryden-accuracy"].module == "dryden.accuracy"
    assert EXPERIMENTS["lpc-fig3a"].module == "lpc.fig3a"
    reproduce = SRC / "experiments" / "reproduce"
    for experiment in EXPERIMENTS.values():
        paper, name = experiment.module.split(".")
        assert (reproduce / paper / f"{name}.py").is_file(), experiment.id
