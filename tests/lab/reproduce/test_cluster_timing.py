"""The timing reproductions refuse to run without root or iproute2 (exit 2, one line, nothing
written), and ``--list`` says which ids need root."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradzip.cli import main
from gradzip_lab.bench import cluster_netns
from gradzip_lab.reproduce import EXPERIMENTS

TIMING = ("dryden-allreduce", "qesgd-speedup", "dqgan-speedup", "lpc-timesplit")


@pytest.mark.parametrize("experiment", TIMING)
def test_refuses_without_root(
    experiment: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(cluster_netns.os, "geteuid", lambda: 1000)
    out = tmp_path / "out"
    assert main(["reproduce", experiment, "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"gradzip reproduce: {experiment} needs root (network namespaces, veth, tc); run it as root"
    ]
    assert not out.exists()


def test_refuses_without_iproute2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cluster_netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster_netns.shutil, "which", lambda tool: None)
    assert main(["reproduce", "lpc-timesplit", "--out", str(tmp_path)]) == 2
    assert "needs the ip and tc command (iproute2)" in capsys.readouterr().err


def test_list_marks_the_ids_that_need_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "--list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    for experiment in EXPERIMENTS:
        assert lines[experiment].endswith("(needs root)") == (experiment in TIMING)
    assert all(EXPERIMENTS[e].needs_root for e in TIMING)
