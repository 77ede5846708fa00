"""The lab's subcommands as the command line finds them: registered as ``gradzip.commands``
entry points, ``gradzip bench``, ``gradzip reproduce`` and ``gradzip tune`` are the lab's parsers, and the
experiment ids the command line checks before loading the experiments are the registry's."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

from gradzip.cli import main
from gradzip.cli.commands import GROUP, LAB_COMMANDS
from gradzip_lab.cli import experiment_ids

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _declared_entry_points() -> dict[str, str]:
    """The ``gradzip.commands`` table of pyproject.toml (``name = "value"`` lines; read by
    hand: tomllib is Python 3.11+ and the project supports 3.10)."""
    lines = PYPROJECT.read_text().splitlines()
    start = lines.index(f'[project.entry-points."{GROUP}"]') + 1
    found: dict[str, str] = {}
    for line in lines[start:]:
        if line.startswith("["):
            break
        if "=" in line and not line.startswith("#"):
            name, value = line.split("=", 1)
            found[name.strip()] = value.strip().strip('"')
    return found


def test_the_lab_registers_bench_reproduce_and_tune() -> None:
    declared = _declared_entry_points()
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
