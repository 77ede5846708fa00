"""A mistake on the command line is refused before torch is imported (which takes seconds):
each bad command below runs in one fresh interpreter that must not have torch in
``sys.modules`` afterwards. Deterministic: what was imported, not how long it took."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

#: commands refused (status 2) by the parser or by a subcommand's quick checks
BAD = [
    ["train", "--bogus"],
    ["train", "--compressor", "nope"],
    ["train", "--workers", "-1"],
    ["train", "--workers", "three"],
    ["train", "--backend", "nope"],
    ["train", "--method", "nope"],
    ["train", "--model", "vgg"],
    ["train", "--scheme", "nope"],
    ["train", "--lr", "-1"],
    ["train", "--batch-size", "100", "--workers", "8"],
    ["train", "--timeout", "0"],
    ["train", "--max-steps", "0"],
    ["train", "--resume", "somewhere", "--out", "elsewhere"],
    ["bench", "codecs", "--only", "nope"],
    ["bench", "codecs", "--numel", "0"],
    ["bench", "collectives", "--schemes", "nope"],
    ["bench", "cluster", "--rates", "fast"],
    ["bench", "cluster", "--steps", "0"],
    ["bits", "--model", "vgg", "--compressor", "dqsg"],
    ["bits", "--model", "lenet", "--compressor", "zip"],
    ["bits"],
    ["reproduce", "nope"],
    ["list", "tables"],
    ["nope"],
]

#: runs each command of argv[1] (a JSON list) through gradzip.cli.main in this interpreter;
#: prints, per command, its exit status and whether torch had been imported by then
PROBE = """
import contextlib, io, json, sys
from gradzip.cli import main
seen = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as stop:
            status = stop.code
    seen.append([argv, status, "torch" in sys.modules])
print(json.dumps(seen))
"""


def probe(commands: list[list[str]]) -> list[tuple[list[str], int, bool]]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(commands)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return [tuple(row) for row in json.loads(done.stdout)]  # type: ignore[misc]


@pytest.mark.distributed  # the command runs in a subprocess
def test_a_bad_command_is_refused_without_importing_torch() -> None:
    # one interpreter for all: the first command that imports torch is the one named
    for argv, status, torch_loaded in probe(BAD):
        assert status == 2, argv
        assert not torch_loaded, f"`gradzip {' '.join(argv)}` imported torch before refusing"


@pytest.mark.distributed
def test_version_and_help_need_no_torch() -> None:
    rows = probe([["--version"], ["-h"], ["bench", "codecs", "-h"], ["list", "-h"]])
    assert [(status, torch_loaded) for _, status, torch_loaded in rows] == [(0, False)] * 4
