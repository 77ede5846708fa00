"""What every ``gradzip`` subcommand's help and errors show: each option's default in
``--help``, and a mistyped option answered with the usage of the subcommand it was given to
(argparse's own answer is the top-level usage)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence

#: where a parsed namespace records the innermost parser that read it
_PARSER = "_usage_parser"


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
    itself in the namespace it parses (the innermost one wins)."""
    for each in subparsers(parser):
        each.formatter_class = DefaultsHelpFormatter
        each.set_defaults(**{_PARSER: each})
        for action in each._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if action.option_strings and not action.help:
                # argparse prints nothing after an option without help, not even a default
                action.help = "(default: %(default)s)" if says_something(action.default) else None


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an unknown option is reported with the usage of the
    subcommand that was given it."""
    args, rest = parser.parse_known_args(argv)
    if rest:
        owner: argparse.ArgumentParser = getattr(args, _PARSER, parser)
        owner.error(f"unrecognized arguments: {' '.join(rest)}")
    if hasattr(args, _PARSER):
        delattr(args, _PARSER)
    return args
