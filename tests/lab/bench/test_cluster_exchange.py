"""The timing reproductions' rank program and figures: the arithmetic on given timings, and one
run of the rank function on localhost gloo (bytes and structure, never speed)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import gradzip
from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import Transport
from gradzip_lab.bench.cluster_exchange import (
    FIGURES,
    CodecClock,
    ExchangeCase,
    ExchangeConfig,
    exchange_cases,
)
from gradzip_lab.bench.cluster_timing import (
    case_summaries,
    median_step,
    paired_ratio,
    step_seconds,
    time_split,
    wire_megabytes,
)


def _figures(compute: list[float], exchange: list[float], **more: list[float]) -> dict[str, Any]:
    zeros = [0.0] * len(compute)
    out: dict[str, Any] = {name: list(zeros) for name in FIGURES}
    out.update(compute_s=compute, exchange_s=exchange, **more)
    return out


def _ranks() -> list[dict[str, Any]]:
    return [
        {"cases": {"fp32": _figures([1, 1, 1], [3, 5, 2]), "q": _figures([1, 1, 1], [1, 1, 2])}},
        {"cases": {"fp32": _figures([1, 1, 1], [2, 7, 1]), "q": _figures([1, 1, 1], [0, 2, 1])}},
    ]


def test_step_time_is_the_slowest_rank_and_ratios_pair_steps() -> None:
    ranks = _ranks()
    assert step_seconds(ranks, "fp32") == [4, 8, 3]
    assert step_seconds(ranks, "q") == [2, 3, 3]
    assert median_step(ranks, "fp32") == 4
    # per step 4/2, 8/3, 3/3: the median of the paired ratios, not a ratio of medians (4/3)
    assert paired_ratio(ranks, "fp32", "q") == pytest.approx(2.0)


def test_a_stated_compute_replaces_the_recorded_one() -> None:
    ranks = _ranks()
    # exchanges: fp32 slowest 3, 7, 2; q 1, 2, 2 (each rank recorded compute 1)
    assert step_seconds(ranks, "fp32", compute=10) == [13, 17, 12]
    assert median_step(ranks, "q", compute=0) == 2
    # per step 13/11, 17/12, 12/12
    assert paired_ratio(ranks, "fp32", "q", compute=10) == pytest.approx(13 / 11)


def test_case_summaries() -> None:
    summary = case_summaries(_ranks())
    assert set(summary) == {"fp32", "q"}
    assert summary["fp32"]["step_ms"] == pytest.approx(4000.0)
    assert summary["fp32"]["exchange_ms"] == pytest.approx(3000.0)  # slowest: 3, 7, 2
    assert summary["q"]["wire_mb_max_rank"] == 0.0


def test_time_split_and_wire_bytes() -> None:
    figures = _figures(
        [1.0, 1.0, 1.0],
        [0.5, 0.7, 0.6],
        encode_s=[0.1, 0.1, 0.1],
        decode_s=[0.2, 0.2, 0.2],
        tx_bytes=[1e6, 1e6, 1e6],
        rx_bytes=[3e6, 3e6, 3e6],
        payload_bytes=[5e5, 5e5, 5e5],
    )
    split = time_split([{"cases": {"x": figures}}], "x")
    assert split["computation"] == pytest.approx(1.0)
    assert split["encoding"] == pytest.approx(0.1)
    assert split["decoding"] == pytest.approx(0.2)
    assert split["transmission"] == pytest.approx(0.3)  # median of 0.2, 0.4, 0.3
    wire = wire_megabytes([{"cases": {"x": figures}}], "x")
    assert wire == {"max_rank": 4.0, "mean_rank": 4.0, "payload_sent": 0.5}


def test_codec_clock_counts_encode_and_decode() -> None:
    compressor = gradzip.create("qsgd", s=4)
    clock = CodecClock(compressor)
    x = torch.randn(1000)
    encoded = compressor.encode(x)
    compressor.decode(bytes(encoded.payload), shape=x.shape)
    encode, decode = clock.take()
    assert encode > 0 and decode > 0
    assert clock.take() == (0.0, 0.0)


def _rank(transport: Transport, config: ExchangeConfig) -> dict[str, Any]:
    config.rank = transport.rank
    return exchange_cases(config)


@pytest.mark.slow
@pytest.mark.distributed
def test_exchange_cases_on_localhost_gloo() -> None:
    cases = [
        ExchangeCase("fp32", "allreduce", (8, 16)),
        ExchangeCase("id", "scheme", (8, 16), "identity", scheme="ps[fp32]"),
        ExchangeCase("q8", "scheme", (8, 16), "hou", {"b": 8}, "ps[fp32]", compute_seconds=0.01),
    ]
    config = ExchangeConfig(0, 2, "127.0.0.1", 0, cases, steps=2, warmup=1, timeout=60.0)
    config.device = "lo"
    ranks = run_processes(2, _rank, config, timeout=60.0)
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert set(r["cases"]) == {"fp32", "id", "q8"}
        for figures in r["cases"].values():
            assert set(figures) == set(FIGURES)
            assert all(len(values) == 2 for values in figures.values())
        assert r["cases"]["fp32"]["payload_bytes"] == [0, 0]  # gloo's own bytes: not metered
        assert min(r["cases"]["q8"]["compute_s"]) >= 0.01
        assert r["cases"]["id"]["compute_s"] == pytest.approx([0.0, 0.0], abs=0.01)
    # the worker (rank 1) sends one payload per step: 128 float32 values against 128 bytes
    worker = ranks[1]["cases"]
    assert worker["id"]["payload_bytes"][0] > 4 * 128 > worker["q8"]["payload_bytes"][0] > 128
    assert worker["q8"]["encode_s"][0] > 0
