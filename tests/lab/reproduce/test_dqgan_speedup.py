"""``dqgan-speedup``: the model's size, and its rows from given timings (no cluster)."""

from __future__ import annotations

import pytest

from gradzip_lab.reproduce.dqgan.speedup import (
    cases,
    parameters,
    speedup_rows,
    transfer_seconds,
)
from tests.lab.reproduce.timing_fixtures import ranks


def test_dcgan32_size_and_cases() -> None:
    # generator 409,856 + 524,416 + 131,136 + 3,075; critic 3,136 + 131,200 + 524,544 + 4,097
    assert parameters() == 1_731_460
    built = cases(100, 0.5)
    assert [(c.compressor, c.scheme, c.compute_seconds) for c in built] == [
        ("identity", "ps[fp32]", 0.5),
        ("hou", "ps[fp32]", 0.5),
    ]


def test_speedup_is_p_times_compute_over_the_step() -> None:
    exchange = {"CPOAdam fp32": [[1.0, 1.0], [0.5, 1.0]], "DQGAN 8-bit": [[0.5, 0.5], [0.5, 0.5]]}
    compute = {"CPOAdam fp32": 1.0, "DQGAN 8-bit": 1.0}
    rows = {r.quantity: r.ours for r in speedup_rows(ranks(exchange, compute), 4, 1.0)}
    assert rows["speed-up over 1 worker, CPOAdam fp32, 4 workers"] == pytest.approx(2.0)
    assert rows["speed-up over 1 worker, DQGAN 8-bit, 4 workers"] == pytest.approx(4 / 1.5)
    assert rows["8-bit over fp32 step time ratio, 4 workers"] == pytest.approx(2 / 1.5)


def test_a_stated_ratio_sets_the_compute_of_its_rows() -> None:
    # exchanges: fp32 slowest 1.0 and 1.0, 8-bit 0.5 and 0.5; the ranks recorded compute 1.0
    exchange = {"CPOAdam fp32": [[1.0, 1.0], [0.5, 1.0]], "DQGAN 8-bit": [[0.5, 0.5], [0.5, 0.5]]}
    compute = {"CPOAdam fp32": 1.0, "DQGAN 8-bit": 1.0}
    numel = 1_000_000  # 32 Mbit: 0.32 s on the 100 Mbit/s link
    assert transfer_seconds(numel) == pytest.approx(0.32)
    stated = transfer_seconds(numel) / 0.25  # rho 0.25: 1.28 s of compute
    rows = {r.quantity: r.ours for r in speedup_rows(ranks(exchange, compute), 4, stated, rho=0.25)}
    assert rows["speed-up over 1 worker, CPOAdam fp32, 4 workers, rho 0.25"] == pytest.approx(
        4 * 1.28 / 2.28
    )
    assert rows["speed-up over 1 worker, DQGAN 8-bit, 4 workers, rho 0.25"] == pytest.approx(
        4 * 1.28 / 1.78
    )
    assert rows["8-bit over fp32 step time ratio, 4 workers, rho 0.25"] == pytest.approx(
        2.28 / 1.78
    )
