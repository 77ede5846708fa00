"""``qesgd-speedup``: the models as run, and its rows from given timings (no cluster)."""

from __future__ import annotations

import pytest

from gradzip_lab.reproduce.qesgd.speedup import IDEAL, PAPER, cases, models, speedup_rows
from tests.lab.reproduce.timing_fixtures import ranks


def test_models_keep_each_papers_compute_per_byte() -> None:
    full, quick = models(False), models(True)
    assert full["ResNet-56"] == (850_000, pytest.approx(2.0))
    # AlexNet: 57 M values in 0.3 s, cut to 850,000 values with its compute cut alike, x 10
    assert full["AlexNet"] == (850_000, pytest.approx(10 * 0.3 * 850_000 / 57_000_000))
    assert quick["ResNet-56"] == (106_250, pytest.approx(0.25))
    assert pytest.approx(1.6) == IDEAL
    built = {c.label: c for c in cases(full)}
    assert (
        built["QESGD AlexNet"].compressor == "qesgd" and built["SGD AlexNet"].scheme == "ps[fp32]"
    )


def test_speedup_rows() -> None:
    plan = {"ResNet-56": (10, 1.0)}
    exchange = {"SGD ResNet-56": [[1.0, 2.0, 1.0]], "QESGD ResNet-56": [[0.5, 0.5, 1.0]]}
    compute = {"SGD ResNet-56": 1.0, "QESGD ResNet-56": 1.0}
    rows = {r.quantity: r for r in speedup_rows(ranks(exchange, compute), plan, 4)}
    speedup = rows["speed-up over SGD, ResNet-56, 4 workers"]
    # per step (1+1)/(1+0.5), (1+2)/(1+0.5), (1+1)/(1+1): median 4/3
    assert (speedup.paper, speedup.ours) == (PAPER["ResNet-56", 4], pytest.approx(4 / 3))
    comm = rows["communication-only speed-up, ResNet-56, 4 workers"]
    assert (comm.paper, comm.ours) == (IDEAL, pytest.approx(1.0 / 0.5))
    assert rows["SGD ResNet-56 step time, 4 workers"].ours == pytest.approx(2000.0)
