"""``gradzip bench codecs --threads``: torch and numba both at each count, 0 = every core, and a
summary line per codec with its round trip as % of memcpy at each count."""

from __future__ import annotations

import json
from pathlib import Path

import numba
import pytest
import torch

from gradzip.cli import main
from gradzip_lab.bench import codecs


def test_zero_means_every_core_and_counts_are_clamped() -> None:
    most = int(numba.config.NUMBA_NUM_THREADS)
    assert codecs.resolve_threads(0) == most
    assert codecs.resolve_threads(1) == 1
    assert codecs.resolve_threads(most + 5) == most


def test_each_count_sets_torch_and_numba_and_restores_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int]] = []
    real = codecs.memcpy_gbps

    def memcpy_spy(numel: int, repeat: int) -> float:
        seen.append((torch.get_num_threads(), numba.get_num_threads()))
        return real(numel, repeat)

    monkeypatch.setattr(codecs, "memcpy_gbps", memcpy_spy)
    numba.get_num_threads()  # numba's OpenMP layer, on its launch, may reset torch's count
    torch.set_num_threads(1)
    before = torch.get_num_threads(), numba.get_num_threads()
    path = tmp_path / "bench.json"
    args = ["bench", "codecs", "--numel", "4096", "--repeat", "1", "--only", "dqsg", "qsgd"]
    assert main([*args, "--threads", "1", "0", "--json", str(path)]) == 0
    most = int(numba.config.NUMBA_NUM_THREADS)
    assert seen == [(1, 1), (most, most)]
    assert (torch.get_num_threads(), numba.get_num_threads()) == before
    out = capsys.readouterr().out
    summary = out[out.index("round trip (fresh output / into a buffer)") :].splitlines()
    assert summary[1].split()[0] == "compressor"
    assert [line.split()[0] for line in summary[2:4]] == ["dqsg", "qsgd"]
    # per thread count: "fresh% / buffer%"
    assert all(len(line.split()) == 7 and line.endswith("%") for line in summary[2:4])
    figures = json.loads(path.read_text())
    assert [run["threads"] for run in figures["runs"]] == [1, most]
    assert figures["threads"] == 1 and figures["codecs"] == figures["runs"][0]["codecs"]


def test_negative_thread_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "codecs", "--threads", "-1"]) == 2
    assert "--threads must be >= 0" in capsys.readouterr().err
