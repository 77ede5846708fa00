"""Subcommands that other installed packages add to ``gradzip``, found through the
``gradzip.commands`` entry-point group.

Each entry point names a function ``add(sub)`` that adds one parser, named as the entry point,
to the subparsers of the ``gradzip`` parser (and sets its ``func``). This repository's paper lab
(the ``gradzip_lab`` package, installed beside the library by ``make setup``) registers
``bench`` and ``reproduce`` there; the library never imports it. Loading an entry point imports
only its command-line module, which imports nothing heavy, so a bad option is still refused
before torch loads.

When the lab is not installed (or its entry point cannot be loaded), ``gradzip bench`` and
``gradzip reproduce`` still exist: they accept any arguments and answer in one line that the lab
is missing and how to install it (exit 2).
"""

from __future__ import annotations

import argparse
from importlib.metadata import entry_points
from typing import Any

from gradzip.cli.help import accept_anything, fail

#: the entry-point group a package adds ``gradzip`` subcommands to
GROUP = "gradzip.commands"

#: the paper lab's subcommands, listed by ``gradzip --help`` whether or not it is installed
LAB_COMMANDS = {
    "bench": "benchmarks that print measured figures",
    "reproduce": "recompute a table or figure of the papers and compare with their numbers",
    "tune": "measure your link, codecs and model; print the variant to use",
}

INSTALL = "install this repository with `make setup` (pip install -e '.[dev]')"


def add_command_parsers(sub: Any) -> None:
    """Add every registered subcommand to ``sub`` (the lab's first, in their order, then the
    others by name), and a placeholder for each lab subcommand that is not installed. An entry
    point named like a built-in subcommand is ignored: the built-in one stays."""
    builtin = set(sub.choices)
    found = {p.name: p for p in entry_points(group=GROUP) if p.name not in builtin}
    for name in [*LAB_COMMANDS, *sorted(set(found) - set(LAB_COMMANDS))]:
        point = found.get(name)
        if point is None:
            _add_missing(sub, name, "is not installed")
            continue
        try:
            add = point.load()
        except ImportError as err:  # metadata left behind by an uninstalled package
            _add_missing(sub, name, f"cannot be imported ({err})")
            continue
        add(sub)


def _add_missing(sub: Any, name: str, why: str) -> None:
    """``gradzip NAME ...``: any arguments, one line saying what is missing (exit 2)."""
    prog = f"gradzip {name}"
    parser = sub.add_parser(
        name, help=f"{LAB_COMMANDS.get(name, name)} (not installed)", add_help=False
    )
    accept_anything(parser)

    def refuse(args: argparse.Namespace) -> int:
        return fail(prog, f"needs the paper lab (package gradzip_lab), which {why}: {INSTALL}")

    parser.set_defaults(func=refuse)
