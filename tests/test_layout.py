"""The moved modules keep working at their old paths (with a ``DeprecationWarning`` naming the
new one), and a reproduction's module is named by its id. That the library never imports the
application is tests/test_architecture.py's business."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import gradzip
from gradzip.experiments.reproduce import EXPERIMENTS
from tests.test_architecture import deprecated_aliases

SRC = Path(gradzip.__file__).parent

MOVED = {
    "gradzip.experiments.data": ("gradzip.data.datasets", "load_dataset"),
    "gradzip.experiments.data_batches": ("gradzip.data.batches", "EpochBatches"),
    "gradzip.experiments.data_files": ("gradzip.data.files", "read_idx"),
    "gradzip.experiments.corpus": ("gradzip.data.corpus", "pydoc_corpus"),
    "gradzip.experiments.models": ("gradzip.models.paper", "build_model"),
    "gradzip.experiments.layers": ("gradzip.models.layers", "Dense"),
    "gradzip.experiments.resnet": ("gradzip.models.resnet", "resnet"),
    "gradzip.experiments.charlstm": ("gradzip.models.charlstm", "char_lstm"),
    "gradzip.experiments.shapes": ("gradzip.models.shapes", "MODEL_SHAPES"),
    "gradzip.experiments.workers": ("gradzip.simulation.workers", "PerWorkerGradients"),
    "gradzip.algorithms.qesgd_checkpoint": ("gradzip.algorithms.qesgd.checkpoint", "save"),
    "gradzip.algorithms.qesgd_codec": ("gradzip.algorithms.qesgd.codec", "OffsetCodec"),
    "gradzip.algorithms.qesgd_messages": ("gradzip.algorithms.qesgd.messages", "ServerLink"),
    "gradzip.algorithms.qesgd_schedule": ("gradzip.algorithms.qesgd.schedule", "DeltaSchedule"),
    "gradzip.algorithms.qesgd_server": ("gradzip.algorithms.qesgd.server", "DistributedQESGD"),
    "gradzip.algorithms.qesgd_state": ("gradzip.algorithms.qesgd.state", "EpochState"),
    "gradzip.tables": ("gradzip.experiments.reproduce.dqsg.bit_counts", "table1"),
    "gradzip.compressors.common": ("gradzip.compressors.buckets", "num_buckets"),
}


def test_every_deprecated_alias_is_checked_here() -> None:
    assert set(MOVED) == deprecated_aliases()


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_warns_and_gives_the_moved_names(old: str) -> None:
    new, name = MOVED[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        shim = importlib.import_module(old)
    assert getattr(shim, name) is getattr(importlib.import_module(new), name)
    assert set(shim.__all__) <= set(dir(importlib.import_module(new)))


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
