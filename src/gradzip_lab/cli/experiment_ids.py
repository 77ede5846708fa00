"""The reproduced experiments' ids, checked by ``gradzip reproduce`` before the experiments
(which import torch) are loaded: a plain copy of :data:`gradzip_lab.reproduce.EXPERIMENTS`'
names, as :mod:`gradzip.cli.catalog` holds the library's registries' names.
``tests/cli/test_catalog.py`` asserts that the copy equals the registry."""

from __future__ import annotations

from gradzip.cli.catalog import registered

#: gradzip_lab.reproduce.EXPERIMENTS, in order
EXPERIMENTS = (
    "dqsg-table1",
    "dqsg-table2",
    "dqsg-table3",
    "dqsg-fig4",
    "dqsg-fig5",
    "qesgd-table1",
    "qesgd-fmnist",
    "qesgd-lstm",
    "qesgd-table2",
    "lpc-fig3a",
    "lpc-fig3b",
    "lpc-fig3c",
    "lpc-clipping",
    "lpc-table2",
    "dqgan-bilinear",
    "dqgan-mixture",
    "dqgan-mnist",
    "dryden-accuracy",
    "dryden-volume",
    "dryden-allreduce",
    "qesgd-speedup",
    "dqgan-speedup",
    "lpc-timesplit",
)


def experiments() -> tuple[str, ...]:
    """The experiment ids: the registry's once it is imported, else the copy above."""
    return registered("gradzip_lab.reproduce", lambda m: m.EXPERIMENTS, EXPERIMENTS)
