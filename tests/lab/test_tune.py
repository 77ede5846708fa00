"""``gradzip tune``: a 2-rank gloo run on localhost measures the link (positive, finite alpha
and rate), ranks the variants and names one whose spelling parses; offline, the command line
prints the ranking and a snippet; bad options are refused before anything loads."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from gradzip.comm.spawn import run_processes
from gradzip.schemes.spec import ExchangeSpec
from gradzip_lab.cli.tune import add_tune_parser
from gradzip_lab.tune import CANDIDATES, snippet

TORCH_VARIANTS = {"fp32", "fp16_hook", "powersgd_r1"}


def _tune_rank(transport: Any) -> tuple[str, float, float, float]:
    from gradzip_lab.tune_run import tune

    result = tune("fc-300-100", sizes_mb=(0.25, 1.0), codec_numel=1 << 16)
    assert result.measured is not None
    return result.best, result.measured.alpha_s, result.measured.gbit_per_s, result.seconds


def _parses(variant: str) -> bool:
    if variant in TORCH_VARIANTS:
        return True
    return str(ExchangeSpec.parse(variant)) == variant


@pytest.mark.distributed
def test_two_gloo_ranks_tune_and_name_a_variant_that_parses() -> None:
    results = run_processes(2, _tune_rank, timeout=120.0)
    assert results[0][:3] == results[1][:3] or results[0][1:3] == results[1][1:3]
    best, alpha, gbit, seconds = results[0]
    assert best in CANDIDATES and _parses(best)
    assert math.isfinite(alpha) and alpha >= 0
    assert math.isfinite(gbit) and gbit > 0
    assert seconds < 60  # the brief: under a minute (the small model and sizes: far under)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gradzip")
    add_tune_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_offline_tune_prints_a_ranking_and_a_snippet(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", "--model", "fc-300-100", "--world-size", "8", "--link-rate", "1"]
    assert _main(argv) == 0
    out = capsys.readouterr().out
    best = out.split("use: ", 1)[1].split()[0]
    assert _parses(best)
    assert snippet(best).splitlines()[0] in out


def test_half_an_offline_link_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["tune", "--world-size", "8"]) == 2
    assert "both --world-size and --link-rate" in capsys.readouterr().err


def test_every_candidate_has_a_snippet_and_parses() -> None:
    for variant in CANDIDATES:
        assert _parses(variant)
        assert snippet(variant)
