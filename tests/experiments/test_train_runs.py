"""`gradzip train` runs that never mix, stop cleanly on a signal, and resume bit for bit.

The signal tests run the real command in a subprocess with its own process group, wait for its
first metrics line (so the run is training, whatever the machine's speed) and signal it; their
time limits are many times what the runs normally need.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from gradzip import state_file
from gradzip.cli import main

TINY = ["--max-steps", "3", "--eval-every", "2", "--workers", "2", "--no-progress"]
#: a run far too long to finish before it is signalled (50 epochs of MNIST)
LONG = ["--epochs", "50", "--eval-every", "4", "--workers", "2", "--no-progress"]
#: state that a resume must carry: Adam's moments, each rank's error-feedback residual
STATEFUL = ["--compressor", "qsgd", "--error-feedback"]
QESGD = ["--method", "qesgd", "--optimizer", "sgd", "--method-param", "norm_samples=256"]
RESULTS = ("summary.json", "report.md", "accuracy.png", "loss.png", "bits.png")


def rows(out: Path) -> list[dict[str, Any]]:
    """The metrics rows without their wall time."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]


def parameters(out: Path) -> dict[str, torch.Tensor]:
    state: dict[str, Any] = state_file.read(out / "checkpoint.pt")
    return dict(state["model"])


def same_run(a: Path, b: Path) -> None:
    """``a`` and ``b`` took the same steps: every metrics row (but wall time) and every final
    parameter equal, bit for bit."""
    assert rows(a) == rows(b)
    pa, pb = parameters(a), parameters(b)
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name


def summary(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return result


# -- run directories --------------------------------------------------------------------------


def test_default_run_directories_never_mix_two_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    m2 = ["train", *TINY, "--compressor", "dqsg", "--param", "M=2"]
    m4 = ["train", *TINY, "--compressor", "dqsg", "--param", "M=4", "--optimizer", "sgd"]
    for args in (m2, m4, m2):
        assert main(args) == 0
    printed = re.findall(r"run directory (\S+)", capsys.readouterr().out)
    first, other, repeat = printed
    assert re.fullmatch(r"runs/fc-300-100-dqsg-2w-s0-[0-9a-f]{6}", first), first
    assert other.startswith("runs/fc-300-100-dqsg-2w-s0-") and other != first
    assert repeat == f"{first}-2"  # the same options again: a new directory beside the first
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(
        Path(p).name for p in printed
    )
    assert json.loads((tmp_path / first / "config.json").read_text())["compressor_params"] == {
        "M": 2
    }
    assert json.loads((tmp_path / other / "config.json").read_text())["compressor_params"] == {
        "M": 4
    }


def test_an_out_holding_a_run_is_refused_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", *TINY, "--optimizer", "sgd", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"--out {out} already holds a run" in err and "--force" in err and "--resume" in err
    assert rows(out)[-1]["step"] == 3  # untouched
    (out / "notes.txt").write_text("mine")  # not a run file: --force leaves it
    (out / "checkpoint.pt.tmp").write_text("left by a killed run")
    assert main(["train", *TINY, "--max-steps", "1", "--force", "--out", str(out)]) == 0
    assert [r["step"] for r in rows(out)] == [1]
    assert summary(out)["steps"] == 1 and summary(out)["complete"] is True
    assert json.loads((out / "config.json").read_text())["max_steps"] == 1
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "checkpoint.pt.tmp").exists()


# -- resume -----------------------------------------------------------------------------------


def test_a_resumed_run_equals_one_never_stopped(tmp_path: Path) -> None:
    options = ["--workers", "2", "--no-progress", "--eval-every", "2", *STATEFUL]
    assert main(["train", *options, "--max-steps", "5", "--out", str(tmp_path / "whole")]) == 0
    part = tmp_path / "part"
    assert main(["train", *options, "--max-steps", "2", "--out", str(part)]) == 0
    assert summary(part)["steps"] == 2
    assert main(["train", "--resume", str(part), "--max-steps", "5"]) == 0
    same_run(tmp_path / "whole", part)
    assert summary(part)["steps"] == 5 and summary(part)["complete"] is True
    assert json.loads((part / "config.json").read_text())["max_steps"] == 5


def test_resume_refuses_other_options_and_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["train", *TINY, "--seed", "1", "--out", str(out)]) == 0
    before = rows(out)
    capsys.readouterr()
    # --seed 0 is the default, but given explicitly it is a change all the same
    assert main(["train", "--resume", str(out), "--momentum", "0.5", "--seed", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert (
        "cannot resume" in err and "--momentum" in err and "--seed (checkpoint: 1, now: 0)" in err
    )
    assert "--lr" not in err  # unchanged options are not listed
    assert main(["train", "--resume", str(out), "--out", str(tmp_path / "x")]) == 2
    assert "leave out --out" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "has no checkpoint.pt" in capsys.readouterr().err
    assert main(["train", "--resume", str(out), "--max-steps", "2"]) == 2
    assert "past the 2 steps asked" in capsys.readouterr().err
    assert rows(out) == before


# -- signals ----------------------------------------------------------------------------------


def group_members(group: int) -> list[str]:
    """``pid command`` of every live process in process group ``group`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(f"{entry} {command.decode(errors='replace')[:120]}")
    return found


def start_and_signal(
    args: list[str], out: Path, signum: int, wait: float, again_after: float | None = None
) -> tuple[int, str, list[str]]:
    """Run ``gradzip train *args --out out`` in its own process group, signal it once its
    first metrics row is written (and again ``again_after`` seconds later, if given); its exit
    status, standard error, and the members of its process group still alive right after it
    exited (ranks, apart from Python's resource tracker, which only notices its parent is gone
    then)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    command = [sys.executable, "-m", "gradzip.cli", "train", *args, "--out", str(out)]
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    try:
        deadline = time.monotonic() + wait
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().strip()):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no metrics row in time"
            time.sleep(0.05)
        os.kill(proc.pid, signum)
        if again_after is not None:
            time.sleep(again_after)
            os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=wait)
        # a member without a command line has already exited and is releasing its memory
        # (the resource tracker, which exits once its parent is gone, was seen so)
        left = [
            m for m in group_members(proc.pid) if "resource_tracker" not in m and len(m.split()) > 1
        ]
        deadline = time.monotonic() + wait
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_members(proc.pid) == [], "processes outlived the run"
        return proc.returncode, err, left
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def check_stopped(out: Path, status: int, err: str, signum: int) -> int:
    """The run stopped as it should after ``signum``: the shell's status, one line, a
    summary marked incomplete, the plots and a report saying so. The steps it took."""
    name = signal.Signals(signum).name
    assert status == 128 + signum, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    done = summary(out)
    steps, total = done["steps"], done["total_steps"]
    assert last == (
        f"gradzip train: interrupted by {name} after {steps} of {total} steps; partial run in "
        f"{out} (continue it with `gradzip train --resume {out}`)"
    )
    assert done["complete"] is False and done["interrupted_by"] == name
    assert 1 <= steps < total and [r["step"] for r in rows(out)] == list(range(1, steps + 1))
    assert done["loss"] == rows(out)[-1]["loss"]
    for name_ in RESULTS:
        assert (out / name_).stat().st_size > 0, name_
    assert "Partial run" in (out / "report.md").read_text()
    return int(steps)


@pytest.mark.distributed  # the command runs in a subprocess
@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param(STATEFUL, id="sgd"),
        pytest.param(QESGD, id="qesgd", marks=pytest.mark.slow),
    ],
)
def test_ctrl_c_stops_cleanly_and_the_run_resumes_exactly(
    tmp_path: Path, algorithm: list[str]
) -> None:
    out = tmp_path / "stopped"
    status, err, left = start_and_signal([*LONG, *algorithm], out, signal.SIGINT, wait=300)
    steps = check_stopped(out, status, err, signal.SIGINT)
    assert left == []
    # resumed to two steps more, it equals a run of that length that was never stopped
    assert main(["train", "--resume", str(out), "--max-steps", str(steps + 2)]) == 0
    whole = ["train", *LONG, *algorithm, "--max-steps", str(steps + 2)]
    assert main([*whole, "--out", str(tmp_path / "whole")]) == 0
    same_run(tmp_path / "whole", out)
    assert summary(out)["complete"] is True and "Partial run" not in (out / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.distributed
def test_sigterm_stops_every_gloo_rank_and_leaves_a_partial_run(tmp_path: Path) -> None:
    out = tmp_path / "stopped"
    args = [*LONG, *STATEFUL, "--backend", "gloo"]
    status, err, left = start_and_signal(args, out, signal.SIGTERM, wait=600)
    check_stopped(out, status, err, signal.SIGTERM)
    assert left == []  # the ranks were reaped before the launcher exited
    assert len(state_file.read(out / "checkpoint.pt")["ranks"]) == 2


@pytest.mark.slow
@pytest.mark.distributed
def test_a_second_ctrl_c_kills_every_gloo_rank_and_says_what_is_left(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    args = [*LONG, *STATEFUL, "--backend", "gloo"]
    # the second SIGINT comes long after the launcher has taken the first (it polls every
    # 20 ms) and, on any machine, before the ranks have finished the step, saved and plotted
    status, err, left = start_and_signal(args, out, signal.SIGINT, wait=600, again_after=0.5)
    assert status == 130, err
    assert left == []  # every rank was killed and reaped before the launcher exited
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    steps = len(rows(out))
    # a checkpoint is saved after every epoch and right after the step a stop ends on, which
    # the second signal may have let rank 0 write
    then = (
        f"continue it from its last checkpoint with `gradzip train --resume {out}`"
        if (out / "checkpoint.pt").exists()
        else "it has no checkpoint yet (one is written after every epoch)"
    )
    assert last == (
        f"gradzip train: SIGINT killed the ranks after {steps} steps; {out} keeps the metrics "
        f"of those steps; {then}"
    )
    assert not (out / "report.md").exists()  # nothing written after the kill


@pytest.mark.slow
@pytest.mark.distributed
def test_a_resumed_gloo_run_equals_one_never_stopped(tmp_path: Path) -> None:
    options = ["--workers", "2", "--no-progress", "--eval-every", "2", "--backend", "gloo"]
    options += STATEFUL
    assert main(["train", *options, "--max-steps", "4", "--out", str(tmp_path / "whole")]) == 0
    part = tmp_path / "part"
    assert main(["train", *options, "--max-steps", "2", "--out", str(part)]) == 0
    assert main(["train", "--resume", str(part), "--max-steps", "4"]) == 0
    same_run(tmp_path / "whole", part)


def test_a_run_killed_before_it_wrote_its_results_gets_them_from_its_metrics(
    tmp_path: Path,
) -> None:
    from gradzip.experiments.backends import finish_stopped
    from gradzip.experiments.config import TrainConfig

    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    taken = rows(out)
    for name in RESULTS:
        (out / name).unlink()
    with (out / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"step": 4, "los')  # the row a kill cut short
    config = TrainConfig(workers=2, max_steps=10, eval_every=2, progress=False, out=str(out))
    done = finish_stopped(config, signal.SIGTERM)
    assert rows(out) == taken
    assert summary(out) == {k: v for k, v in done.items() if k != "run_dir"}
    assert done["complete"] is False and done["interrupted_by"] == "SIGTERM"
    assert (done["steps"], done["total_steps"]) == (3, 10)
    assert done["test_acc"] == taken[-1]["test_acc"] and done["loss"] == taken[-1]["loss"]
    assert "Partial run" in (out / "report.md").read_text()
    for name in RESULTS:
        assert (out / name).stat().st_size > 0, name
