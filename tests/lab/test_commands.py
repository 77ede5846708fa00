"""The lab's subcommands as the command line finds them: registered as ``gradzip.commands``
entry points, ``gradzip bench``, ``gradzip reproduce`` and ``gradzip tune`` are the lab's parsers, and the
experiment ids the command line checks before loading the experiments are the registry's."""

from __future__ import annotations

import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from gradzip.cli import main
from gradzip.cli.commands import GROUP, LAB_COMMANDS
from gradzip_lab.cli import experiment_ids

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_lab_registers_bench_reproduce_and_tune() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"][GROUP]
    assert declared == {
        "bench": "gradzip_lab.cli.bench:add_bench_parser",
        "reproduce": "gradzip_lab.cli.reproduce:add_reproduce_parser",
        "tune": "gradzip_lab.cli.tune:add_tune_parser",
    }
    assert set(declared) == set(LAB_COMMANDS)
    # an install made before an entry point was added lacks it until `make setup` runs again
    installed = {point.name: point.value for point in entry_points(group=GROUP)}
    assert installed.items() <= declared.items()


def test_the_installed_commands_are_the_labs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "{codecs,collectives,cluster,project,hook,sim-ranks}" in capsys.readouterr().out
    assert main(["reproduce", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == list(experiment_ids.EXPERIMENTS)


def test_the_experiment_ids_are_the_registrys() -> None:
    from gradzip_lab.reproduce import EXPERIMENTS

    assert tuple(EXPERIMENTS) == experiment_ids.EXPERIMENTS
    assert experiment_ids.experiments() == experiment_ids.EXPERIMENTS
