"""What every ``gradzip`` subcommand's help and errors show: each option's default in
``--help``, and a mistyped option answered with the usage of the subcommand it was given to
(argparse's own answer is the top-level usage).

Every error the command line prints starts with the name of the (sub)command that refused,
as argparse names it: ``gradzip train: --workers must be >= 1``, ``gradzip bench codecs:
unknown compressor(s): nope`` (``gradzip: `` only for errors before a subcommand). Lists of
choices are written ``a, b, c``, never as a Python list."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

#: where a parsed namespace records the innermost parser that read it
_PARSER = "_usage_parser"
#: set in a namespace by a parser that takes any arguments (see :func:`accept_anything`)
_ANYTHING = "_accepts_anything"


def subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases: once each
                yield from subparsers(child)


def says_something(default: object) -> bool:
    """Whether a default is worth printing (0 is; None, False, [] and SUPPRESS are not)."""
    return not (
        default is None or default is False or default == [] or default == argparse.SUPPRESS
    )


class Parser(argparse.ArgumentParser):
    """argparse's parser with gradzip's error conventions (its subparsers are of this class
    too): ``PROG: message`` after the usage, without argparse's ``error:``, and an invalid
    choice listed as ``a, b, c``."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: {message}\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own message prints the choices as a Python list on older Pythons
        if action.choices is not None and value not in action.choices:
            listed = ", ".join(map(str, action.choices))
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r} (choose from {listed})"
            )


def fail(prog: str, message: str, status: int = 2) -> int:
    """Print ``PROG: message`` on standard error (the one error format of the command line);
    ``status`` (2: a usage error)."""
    print(f"{prog}: {message}", file=sys.stderr)
    return status


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already speaks of its
    default, or the default says nothing (None, False, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or not says_something(action.default):
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, "*"):
            return text
        return f"{text} (default: %(default)s)".strip()


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every parser below ``parser`` lists each option's default in its help, and records
    itself in the namespace it parses (the innermost one wins). Every option has a help text
    (``tests/cli/test_help.py``), so none is left without its default."""
    for each in subparsers(parser):
        each.formatter_class = DefaultsHelpFormatter
        each.set_defaults(**{_PARSER: each})


def describe_when_asked(parser: argparse.ArgumentParser, fill: Callable[[], None]) -> None:
    """Call ``fill()`` before ``parser``'s help is formatted for the first time: help text that
    needs the registries (and so torch) is written only when ``--help`` asks for it, not on
    every command."""
    format_help = parser.format_help
    pending = [fill]

    def format_filled_help() -> str:
        while pending:
            pending.pop()()
        return format_help()

    parser.format_help = format_filled_help  # type: ignore[method-assign]


def accept_anything(parser: argparse.ArgumentParser) -> None:
    """Let ``parser`` (a subcommand's, made with ``add_help=False``) take any arguments: they are
    left in ``args.rest`` for its ``func``, which answers whatever was given."""
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(**{_ANYTHING: True})


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an unknown option is reported with the usage of the
    subcommand that was given it."""
    args, rest = parser.parse_known_args(argv)
    if getattr(args, _ANYTHING, False):
        args.rest = [*rest, *args.rest]
    elif rest:
        owner: argparse.ArgumentParser = getattr(args, _PARSER, parser)
        owner.error(f"unrecognized arguments: {' '.join(rest)}")
    for marker in (_PARSER, _ANYTHING):
        if hasattr(args, marker):
            delattr(args, marker)
    return args
