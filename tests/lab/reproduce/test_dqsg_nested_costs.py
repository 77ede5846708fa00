"""What NDQSG saves and risks in Figure 5's setting: per-group bits and the undetected
decoding failures of the nested workers."""

from __future__ import annotations

import pytest

from gradzip_lab.reproduce.dqsg.nested_costs import group_bits, nested_failure_rate


def test_group_bits_give_the_papers_counts_and_the_smaller_whole_run_saving() -> None:
    groups = group_bits()
    m2, m3 = groups["DQSG M=2"], groups["DQSG M=3"]
    nested = groups["nested (L1=3, k=3)"]
    assert m2["paper"] == pytest.approx(619.2, rel=2.5e-3)
    assert nested["paper"] == pytest.approx(422.8, rel=2.5e-3)
    whole_run = 1 - (m2["paper"] + nested["paper"]) / 2 / m2["paper"]
    assert whole_run == pytest.approx(0.16, abs=0.01)
    authors = 1 - (m3["paper"] + nested["paper"]) / 2 / m2["paper"]
    assert authors == pytest.approx(0.05, abs=0.01)
    # folding modulo k spreads the nested symbols: more entropy than DQSG M=2's mostly-zero ones
    assert nested["entropy"] > m2["entropy"]


def test_some_nested_coordinates_are_decoded_wrongly() -> None:
    rates = nested_failure_rate(workers=4, batch=16)
    assert len(rates) == 2
    assert all(0.0 < r < 0.1 for r in rates)
