"""``lpc-timesplit``: its cases, and the split and ratios from given timings (no cluster)."""

from __future__ import annotations

import pytest

from gradzip_lab.bench.cluster_exchange import FIGURES
from gradzip_lab.reproduce.lpc.timesplit import BATCH, INNER, cases, split_rows


def test_cases_follow_lpc_fig3c_setting() -> None:
    assert (BATCH, INNER) == (339, 36)
    built = {c.label: c for c in cases(0.01)}
    assert built["LPC-SVRG-7"].params == {"b": 4} and built["LPC-SVRG-7"].scheme == "allgather"
    # two mini-batch gradients and the epoch's full gradient in 36 shares; QSGD one gradient
    assert built["SVRG"].compute_seconds == pytest.approx(0.01 * (2 + 50_000 / (4 * 339 * 36)))
    assert built["QSGD-7"].compute_seconds == pytest.approx(0.01)


def _figures(exchange: float, encode: float, decode: float, compute: float) -> dict[str, list]:
    out: dict[str, list] = {name: [0.0, 0.0] for name in FIGURES}
    out.update(exchange_s=[exchange] * 2, encode_s=[encode] * 2, decode_s=[decode] * 2,
               compute_s=[compute] * 2)  # fmt: skip
    return out


def test_split_rows() -> None:
    cases_ = {
        "SVRG": _figures(0.10, 0.0, 0.0, 0.02),
        "QSGD-7": _figures(0.03, 0.005, 0.005, 0.01),
        "LPC-SVRG-7": _figures(0.03, 0.005, 0.005, 0.02),
    }
    rows, splits = split_rows([{"cases": cases_}])
    assert splits["LPC-SVRG-7"] == pytest.approx(
        {"computation": 0.02, "encoding": 0.005, "transmission": 0.02, "decoding": 0.005}
    )
    by_name = {r.quantity: r.ours for r in rows}
    assert by_name["SVRG / LPC-SVRG-7 transmission time"] == pytest.approx(5.0)
    assert by_name["SVRG / LPC-SVRG-7 round time (paired, slowest rank)"] == pytest.approx(2.4)
    assert by_name["LPC-SVRG-7 transmission share of the round"] == pytest.approx(40.0)
    assert by_name["SVRG transmission per round"] == pytest.approx(100.0)
