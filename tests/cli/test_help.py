"""What the command line says: every option explains itself and its default, every error
starts with the name of the command that refused it, choices are listed as ``a, b, c``, and
``--version`` prints the installed version."""

from __future__ import annotations

import argparse
import contextlib
import re
from importlib import metadata

import pytest

from gradzip.cli import build_parser, main
from gradzip.cli.help import DefaultsHelpFormatter, says_something, subparsers


def options() -> list[tuple[str, argparse.Action]]:
    """(parser prog, action) for every visible option and positional of every parser, after
    each parser's help was formatted once (help that needs the registries is filled in then)."""
    found = []
    for parser in subparsers(build_parser()):
        parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if action.help == argparse.SUPPRESS:  # the deprecated aliases
                continue
            found.append((parser.prog, action))
    return found


def test_every_option_has_help_that_gives_its_default() -> None:
    missing, no_default = [], []
    for prog, action in options():
        name = f"{prog} {'/'.join(action.option_strings) or action.dest}"
        if not (action.help or "").strip():
            missing.append(name)
            continue
        shown = DefaultsHelpFormatter(prog)._get_help_string(action)
        if says_something(action.default) and "default" not in shown.lower():
            no_default.append(name)
    assert missing == [], "options without help"
    assert no_default == [], "options whose help does not give their default"
    assert len(options()) > 60  # the walk reached the subcommands


def test_the_formatted_train_help_names_the_defaults_and_the_scheme_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--error-feedback each worker keeps the compression error" in out
    assert "--max-steps N stop after N steps (default: every step of --epochs)" in out
    assert "--no-progress no progress bar (default: one on a terminal)" in out
    assert "powersgd: rank, min_compression_rate, factor_scheme, start_step" in out


#: (command, the prefix of its error line): argparse's errors, the subcommands' own checks,
#: and errors found after the heavy imports
ERRORS = [
    (["nope"], "gradzip: "),
    (["train", "--bogus"], "gradzip train: "),
    (["train", "--backend", "nope"], "gradzip train: "),
    (["train", "--workers", "x"], "gradzip train: "),
    (["train", "--workers", "-1"], "gradzip train: "),
    (["train", "--compressor", "nope"], "gradzip train: "),
    (["train", "--param", "X=1", "--no-progress"], "gradzip train: "),
    (["bench", "codecs", "--only", "nope"], "gradzip bench codecs: "),
    (["bench", "collectives", "--steps", "0"], "gradzip bench collectives: "),
    (["bench", "cluster", "--warmup", "1"], "gradzip bench cluster: "),
    (["bits", "--model", "lenet"], "gradzip bits: "),
    (["bits", "--model", "lenet", "--compressor", "dqsg", "--param", "M=x"], "gradzip bits: "),
    (["bits", "table1"], "gradzip bits: "),
    (["reproduce", "nope"], "gradzip reproduce: "),
    (["reproduce", "dqsg-table1", "--seeds", "0"], "gradzip reproduce: "),
    (["list", "tables"], "gradzip list: "),
]


@pytest.mark.parametrize(("argv", "prefix"), ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_every_error_starts_with_the_command_that_refused_it(
    argv: list[str], prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        status = main(argv)
    except SystemExit as stop:
        status = int(stop.code or 0)
    assert status == 2
    err = capsys.readouterr().err
    # the error line comes after the usage (argparse) or alone (the subcommands' checks)
    message = err.strip().splitlines()[-1]
    assert message.startswith(prefix), message
    assert not message.startswith(prefix + "error:"), message  # one prefix, not two
    assert "gradzip: " not in message or prefix == "gradzip: ", message


def test_choices_are_listed_as_words_not_as_a_python_list(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cases = [
        (["train", "--backend", "nope"], "(choose from local, gloo, env)"),
        (["train", "--optimizer", "nope"], "(choose from sgd, adam, adagrad)"),
        (["list", "tables"], "(choose from compressors, experiments, models, schemes)"),
        (["train", "--model", "vgg"], "choose one of fc-300-100, lenet, cifarnet, dryden-mlp"),
        (["train", "--scheme", "nope"], "choose one of allgather, ps, ps_intsum, "),
    ]
    for argv, listed in cases:
        with contextlib.suppress(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert listed in err, err
        assert not re.search(r"\[\s*'", err), err  # no ['a', 'b'] anywhere


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    try:
        expected = metadata.version("gradzip")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        import gradzip

        expected = gradzip.__version__
    assert capsys.readouterr().out == f"gradzip {expected}\n"
