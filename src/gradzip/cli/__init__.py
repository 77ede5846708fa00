"""The ``gradzip`` command line: ``gradzip list``, ``gradzip bits`` and ``gradzip train``, one
module per subcommand (:mod:`gradzip.cli.params`: the ``KEY=VALUE`` grammar they share), and the
subcommands installed packages add (:mod:`gradzip.cli.commands`): the paper lab's ``gradzip
bench codecs|collectives|cluster`` and ``gradzip reproduce``.

Building the parser and parsing the arguments import nothing heavy (no torch): a mistyped
option, a bad choice or ``--version`` is answered at once, and each subcommand checks its
options (:mod:`gradzip.cli.catalog`: the registries' names) before it imports what it runs.
``tests/cli/test_fast_errors.py`` holds it to that."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gradzip.cli.bits import add_bits_parser
from gradzip.cli.commands import add_command_parsers
from gradzip.cli.help import Parser, parse, show_defaults
from gradzip.cli.listing import add_list_parser
from gradzip.cli.train import add_train_parser
from gradzip.cli.version import VersionAction


def build_parser() -> argparse.ArgumentParser:
    """The ``gradzip`` parser: every subcommand, each option's default in its help."""
    parser = Parser(prog="gradzip", description="Gradient compressors that emit real bytes.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    add_list_parser(sub, main)
    add_bits_parser(sub)
    add_train_parser(sub)
    add_command_parsers(sub)
    show_defaults(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); its exit status."""
    args = parse(build_parser(), argv)
    return int(args.func(args))


__all__ = ["build_parser", "main"]
