"""Where things are: the qesgd package exports its algorithm (a reproduction's module is named
by its id: tests/lab/reproduce/test_reproduce.py). That the library never imports the
application or the lab is tests/test_architecture.py's business."""

from __future__ import annotations


def test_the_qesgd_package_exports_what_the_module_did() -> None:
    from gradzip.algorithms import qesgd
    from gradzip.algorithms.qesgd.algorithm import QESGDOptimizer

    assert qesgd.QESGDOptimizer is QESGDOptimizer
    assert "QESGDOptimizer" in qesgd.__all__
