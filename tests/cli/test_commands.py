"""Subcommands added through the ``gradzip.commands`` entry points (gradzip.cli.commands): with
the lab missing, ``gradzip bench`` and ``gradzip reproduce`` still parse any arguments and
answer in one line how to install it (exit 2); another package's command is added too."""

from __future__ import annotations

import argparse
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from gradzip.cli import build_parser, commands, main


def _installed(monkeypatch: pytest.MonkeyPatch, *points: EntryPoint) -> None:
    def found(group: str) -> list[EntryPoint]:
        assert group == commands.GROUP
        return list(points)

    monkeypatch.setattr(commands, "entry_points", found)


@pytest.mark.parametrize(
    "argv",
    [
        ["bench"],
        ["bench", "--help"],
        ["bench", "cluster", "--steps", "0", "--bogus"],
        ["reproduce", "--list"],
        ["reproduce", "dqsg-table1", "--quick"],
        ["list", "experiments"],
    ],
)
def test_without_the_lab_its_commands_say_so_in_one_line(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _installed(monkeypatch)
    assert main(argv) == 2
    captured = capsys.readouterr()
    name = "bench" if argv[0] == "bench" else "reproduce"
    assert captured.out == ""
    assert captured.err == (
        f"gradzip {name}: needs the paper lab (package gradzip_lab), which is not installed: "
        f"{commands.INSTALL}\n"
    )


def test_without_the_lab_the_help_still_lists_its_commands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch)
    text = build_parser().format_help()
    assert "{list,bits,train,bench,reproduce,tune}" in text
    assert "benchmarks that print measured figures (not installed)" in " ".join(text.split())


def test_an_entry_point_that_cannot_be_imported_is_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _installed(monkeypatch, EntryPoint("bench", "no_such_lab.cli:add", commands.GROUP))
    assert main(["bench", "codecs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gradzip bench: needs the paper lab (package gradzip_lab), which ")
    assert "cannot be imported" in err and "no_such_lab" in err and err.count("\n") == 1


def add_hello(sub: Any) -> None:
    """A third-party subcommand: ``gradzip hello NAME``."""
    parser = sub.add_parser("hello", help="say hello")
    parser.add_argument("name", help="whom to greet")
    parser.set_defaults(func=lambda args: print(f"hello {args.name}") or 0)


def test_another_packages_command_is_added_after_the_labs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _installed(monkeypatch, EntryPoint("hello", f"{__name__}:add_hello", commands.GROUP))
    assert main(["hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == ["list", "bits", "train", "bench", "reproduce", "tune", "hello"]


def test_an_entry_point_cannot_replace_a_builtin_command(monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, EntryPoint("train", f"{__name__}:add_hello", commands.GROUP))
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == ["list", "bits", "train", "bench", "reproduce", "tune"]
    assert sub.choices["train"].prog == "gradzip train"
    assert "--workers" in sub.choices["train"].format_help()
