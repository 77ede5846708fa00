"""``gradzip train --method qesgd``: Algorithm 3 in the trainer, its bits, its options, and the
same metrics from simulated ranks and gloo processes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gradzip.cli import main
from gradzip.experiments.config import TrainConfig
from gradzip.experiments.resolved_config import resolved_out

QESGD = [
    "--method", "qesgd", "--optimizer", "sgd", "--lr", "0.1", "--workers", "2",
    "--method-param", "norm_samples=512", "--no-progress",
]  # fmt: skip
D = 266_610  # FC-300-100


def metrics(out: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("seconds")
    return rows


def test_a_qesgd_run_learns_and_reports_the_codes_it_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["--max-steps", "12", "--eval-every", "12", "--method-param", "output=last"]
    assert main(["train", *QESGD, *args, "--out", str(out)]) == 0
    assert "12 steps" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["method"] == "qesgd" and config["scheme"] is None
    assert config["method_options"] == {
        "bits": 8,
        "c": 1.0,
        "output": "last",
        "bucket_size": 0,
        "norm_samples": 512,
    }
    rows = metrics(out)
    for row in rows[:-1]:  # the last step also carries w_{t+1} (the run's end closes an epoch)
        # the codes payload: 8 bits per coordinate plus one header (a few dozen bytes)
        assert row["paper_bits"] == 8 * D
        assert 8 * D < row["wire_bits"] < 8 * D + 8 * 64  # type: ignore[operator]
        # mean over the server (one codes payload) and the worker (one fp32 gradient payload)
        assert row["sent_bits"] == pytest.approx((row["wire_bits"] + 32 * D) / 2, rel=1e-3)
    assert rows[-1]["loss"] < rows[0]["loss"]  # type: ignore[operator]
    assert rows[-1]["test_acc"] is not None and rows[-1]["test_acc"] > 0.5  # type: ignore[operator]
    default = resolved_out(TrainConfig(method="qesgd"))
    assert re.fullmatch(r"runs/fc-300-100-qesgd8-8w-s0-[0-9a-f]{6}", default), default


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--optimizer", "adam"], "--optimizer sgd"),
        (["--momentum", "0.9"], "--optimizer sgd"),
        (["--scheme", "allgather"], "--scheme"),
        (["--method-param", "bits=0"], "--method-param bits must be an int in [1, 16], got 0"),
        (["--method-param", "c=-1"], "--method-param c must be a positive number"),
        (["--method-param", "bucket_size=-5"], "--method-param bucket_size must be"),
        (["--batch-size", "1024"], "norm_samples must be an int of at least --batch-size (1024)"),
        (["--method-param", "bits=eight"], "parameter bits expects int, got 'eight'"),
        (["--method-param", "output=first"], "expects one of average, last, got 'first'"),
        (["--method-param", "b=8"], "has no parameter 'b'; choices: bits, c, output,"),
    ],
)
def test_bad_qesgd_options_are_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["train", *QESGD, "--max-steps", "1", "--out", str(tmp_path / "r"), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_buckets_and_the_average_output_run(tmp_path: Path) -> None:
    out = tmp_path / "b"
    # 4 steps per "epoch" of a 64-sample batch: the run crosses an epoch end (the w_{t+1} message)
    args = ["--max-steps", "3", "--method-param", "bucket_size=4096", "--batch-size", "64"]
    assert main(["train", *QESGD, *args, "--out", str(out)]) == 0
    rows = metrics(out)
    assert len(rows) == 3 and all(r["paper_bits"] == 8 * D for r in rows)
    # the run's last step closes the (partial) epoch: the server also sends w_{t+1} in fp32
    assert rows[-1]["sent_bits"] > rows[0]["sent_bits"] + 32 * D / 2  # type: ignore[operator]


@pytest.mark.slow
@pytest.mark.distributed
def test_gloo_processes_give_the_simulated_qesgd_metrics(tmp_path: Path) -> None:
    common = [*QESGD, "--max-steps", "4", "--eval-every", "2"]
    assert main(["train", *common, "--out", str(tmp_path / "local")]) == 0
    assert main(["train", *common, "--backend", "gloo", "--out", str(tmp_path / "gloo")]) == 0
    assert metrics(tmp_path / "gloo") == metrics(tmp_path / "local")
