"""``dryden-allreduce``: its cases, and its rows from given timings (no cluster)."""

from __future__ import annotations

import pytest

from gradzip_lab.reproduce.dryden.allreduce import (
    PAPER_LAYER,
    PAPER_MATRIX,
    cases,
    label,
    speedup_rows,
)
from tests.lab.reproduce.timing_fixtures import ranks


def test_cases_cover_every_variant_at_every_size() -> None:
    built = cases((64, 128))
    assert [c.label for c in built] == [
        "fp32 64x64", "adaptive 64x64", "one-bit 64x64",
        "fp32 128x128", "adaptive 128x128", "one-bit 128x128",
    ]  # fmt: skip
    by_label = {c.label: c for c in built}
    assert by_label["fp32 64x64"].kind == "allreduce"
    adaptive = by_label["adaptive 128x128"]
    assert (adaptive.scheme, adaptive.error_feedback, adaptive.shape) == ("ring", True, (128, 128))
    assert all(c.compute_seconds == 0 for c in built)  # the layer's compute is added afterwards


def test_speedup_rows_put_the_paper_beside_the_largest_matrix() -> None:
    exchange = {
        label("fp32", 64): [[1.0, 1.0], [0.5, 3.0]],
        label("adaptive", 64): [[0.5, 0.5], [0.5, 1.0]],
        label("one-bit", 64): [[2.0, 2.0], [2.0, 2.0]],
    }
    rows = {r.quantity: r for r in speedup_rows(ranks(exchange, {}), (64,), "1gbit", 1.0)}
    adaptive = rows["1gbit: adaptive speed-up over fp32 all-reduce, 64x64"]
    # steps: fp32 slowest 1.0 and 3.0, adaptive 0.5 and 1.0: ratios 2 and 3, median 2.5
    assert (adaptive.paper, adaptive.ours) == (PAPER_MATRIX, pytest.approx(2.5))
    assert rows["1gbit: one-bit speed-up over fp32 all-reduce, 64x64"].ours == pytest.approx(1.0)
    layer = rows["1gbit: adaptive speed-up of a layer step, 64x64 layer"]
    # the layer step adds 1 s of compute to the same exchanges: 2/1.5 and 4/2, median 5/3
    assert (layer.paper, layer.ours) == (PAPER_LAYER, pytest.approx((2.0 / 1.5 + 4.0 / 2.0) / 2))
    assert rows["1gbit: fp32 all-reduce time, 64x64"].ours == pytest.approx(2000.0)
