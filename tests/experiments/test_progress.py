"""Progress output: redrawn in place on a terminal, plain bounded lines anywhere else."""

from __future__ import annotations

import io

from gradzip.experiments.progress import Progress

ROW = {"loss": 1.5, "train_acc": 0.5, "test_acc": None, "wire_bits": 1000.0}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(stream: io.StringIO, total: int, interval: float) -> str:
    progress = Progress(total, stream=stream, interval=interval)
    for step in range(1, total + 1):
        progress.update(step, ROW)
    progress.close()
    return stream.getvalue()


def test_a_log_gets_plain_lines_no_carriage_returns_and_at_most_a_dozen() -> None:
    text = run(io.StringIO(), total=5000, interval=0.0)
    lines = text.splitlines()
    assert "\r" not in text and "\033" not in text
    assert 2 <= len(lines) <= 12  # the first step, one per tenth, the last step
    assert lines[0].startswith("[") and "1/5000" in lines[0]
    assert "5000/5000" in lines[-1]


def test_a_log_line_per_tenth_waits_for_the_interval() -> None:
    lines = run(io.StringIO(), total=5000, interval=3600.0).splitlines()
    assert len(lines) == 2  # a quick run: only its first and last step


def test_a_terminal_redraws_one_line() -> None:
    text = run(Terminal(), total=3, interval=0.0)
    assert text.startswith("\r") and text.endswith("\n") and text.count("\n") == 1
