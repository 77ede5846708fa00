"""`gradzip train --resume` on a damaged checkpoint: refused with one `gradzip train:` line
naming the file and saying it is corrupted, a non-zero status, and every file of the run left
byte for byte (and modification time) as it was.

Before checkpoints carried a digest, flipped bytes and zeroed blocks inside a tensor loaded
without complaint: the run trained on from the damaged state and rewrote its directory."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from gradzip.cli import main

TINY = ["--max-steps", "2", "--eval-every", "2", "--workers", "2", "--no-progress"]
#: Adam's moments and every rank's error-feedback residual: a checkpoint with all kinds of state
STATEFUL = ["--compressor", "qsgd", "--error-feedback"]


def flip(data: bytes, start: int) -> bytes:
    """Invert the 16 bytes at ``start``."""
    return data[:start] + bytes(b ^ 0xFF for b in data[start : start + 16]) + data[start + 16 :]


def zero(data: bytes, start: int) -> bytes:
    """Zero 4 KiB at ``start``."""
    return data[:start] + bytes(4096) + data[start + 4096 :]


#: each damage, and what the error line says besides the file's name
DAMAGES: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "16 bytes flipped in the header": (lambda d: flip(d, 30), "is corrupted"),
    "16 bytes flipped a fifth in": (lambda d: flip(d, len(d) // 5), "digest does not match"),
    "16 bytes flipped in the middle": (lambda d: flip(d, len(d) // 2), "digest does not match"),
    "16 bytes flipped near the end": (lambda d: flip(d, len(d) - 100), "digest does not match"),
    "4 KiB zeroed a third in": (lambda d: zero(d, len(d) // 3), "digest does not match"),
    "4 KiB zeroed at the end": (lambda d: zero(d, len(d) - 4096), "digest does not match"),
    "truncated by one byte": (lambda d: d[:-1], "is corrupted: truncated"),
    "truncated to half": (lambda d: d[: len(d) // 2], "is corrupted: truncated"),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-step run, trained once for every test here."""
    out = tmp_path_factory.mktemp("pristine") / "run"
    assert main(["train", *TINY, *STATEFUL, "--out", str(out)]) == 0
    return out


def copy_of(pristine: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    return out


def snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``directory``: its SHA-256 and its modification time in ns."""
    return {
        str(path.relative_to(directory)): (
            hashlib.sha256(path.read_bytes()).hexdigest(),
            path.stat().st_mtime_ns,
        )
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def refused(out: Path, capsys: pytest.CaptureFixture[str], says: str) -> None:
    """Resume ``out``: status 2, one error line naming its checkpoint, nothing changed."""
    before = snapshot(out)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--max-steps", "4"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"gradzip train: {out / 'checkpoint.pt'} "), lines[0]
    assert says in lines[0] and "not loaded" in lines[0], lines[0]
    assert captured.out == ""
    assert snapshot(out) == before, "a refused resume changed the run directory"


@pytest.mark.parametrize("name", list(DAMAGES))
def test_a_damaged_checkpoint_is_refused_and_nothing_changes(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    damage, says = DAMAGES[name]
    out = copy_of(pristine, tmp_path)
    checkpoint = out / "checkpoint.pt"
    good = checkpoint.read_bytes()
    bad = damage(good)
    assert bad != good, "the damage must change the file (a zeroed block may already be zero)"
    checkpoint.write_bytes(bad)
    refused(out, capsys, says)


def test_a_checkpoint_without_a_digest_is_refused(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain torch.save of a valid checkpoint (the format before digests) is not trusted."""
    from gradzip import state_file

    out = copy_of(pristine, tmp_path)
    torch.save(state_file.read(out / "checkpoint.pt"), out / "checkpoint.pt")
    refused(out, capsys, "has no digest")


def test_the_library_refuses_before_it_removes_the_old_results(
    pristine: Path, tmp_path: Path
) -> None:
    """``train(config, resume=True)``, the call behind the command line, checks the digest
    before it deletes the summary, plots and report it would write anew."""
    from gradzip.errors import CheckpointError
    from gradzip.experiments.backends import train
    from gradzip.experiments.config import TrainConfig

    out = copy_of(pristine, tmp_path)
    checkpoint = out / "checkpoint.pt"
    config = TrainConfig.from_dict(
        {**json.loads((out / "config.json").read_text()), "out": str(out)}
    )
    checkpoint.write_bytes(flip(checkpoint.read_bytes(), checkpoint.stat().st_size // 2))
    before = snapshot(out)
    with pytest.raises(CheckpointError, match="digest does not match"):
        train(config, resume=True)
    assert snapshot(out) == before


@pytest.mark.distributed  # starts the command in a process
def test_the_command_exits_non_zero_with_one_line(pristine: Path, tmp_path: Path) -> None:
    """The installed command, as a user runs it: the status and stderr of a real process."""
    out = copy_of(pristine, tmp_path)
    checkpoint = out / "checkpoint.pt"
    checkpoint.write_bytes(zero(checkpoint.read_bytes(), checkpoint.stat().st_size // 2))
    before = snapshot(out)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "gradzip.cli", "train", "--resume", str(out)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"gradzip train: {checkpoint} is corrupted: its SHA-256 digest does not match"
    ), lines[0]
    assert snapshot(out) == before
