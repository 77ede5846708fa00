"""The training-method options of ``gradzip train``: ``--method NAME`` and ``--method-param
KEY=VALUE`` (:mod:`gradzip.experiments.methods`).

Nothing here imports the methods (they import torch) while the parser is built: ``--method``
is checked against the names of :mod:`gradzip.cli.catalog`, and the methods' parameters are
described only when ``--help`` is printed."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any

from gradzip.cli.catalog import methods
from gradzip.cli.help import describe_when_asked
from gradzip.experiments.config import DEFAULT_METHOD


def methods_help() -> str:
    """One paragraph per registered method: its name, summary and parameters."""
    from gradzip.cli.params import Target, describe
    from gradzip.experiments.methods import METHODS as REGISTRY

    parts = []
    for method in REGISTRY.values():
        target = Target.of_dataclass(method.name, method.options)
        params = []
        for f in fields(method.options):
            default = f.default if f.default is not MISSING else "required"
            note = f.metadata.get("help", "")
            kind = describe(target.hints[f.name])
            params.append(f"{f.name}={default} ({kind}){': ' if note else ''}{note}")
        listed = "; ".join(params) if params else "none"
        parts.append(f"{method.name}: {method.summary}. Parameters: {listed}.")
    return " ".join(parts)


def add_method_options(parser: argparse.ArgumentParser) -> None:
    """``--method`` and ``--method-param``."""
    group = parser.add_argument_group("training method (--method NAME, --method-param KEY=VALUE)")
    describe_when_asked(parser, lambda: setattr(group, "description", methods_help()))
    group.add_argument(
        "--method",
        choices=methods(),
        default=DEFAULT_METHOD,
        help="what the ranks exchange and how the parameters follow",
    )
    group.add_argument(
        "--method-param",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the method (repeatable), e.g. --method-param bits=4 (default: "
        "the method's defaults, listed above)",
    )


def method_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The method and its options given on the command line."""
    from gradzip.cli.params import Target, parse_params
    from gradzip.experiments.methods import get_method

    method: str = args.method
    target = Target.of_dataclass(f"method {method!r}", get_method(method).options)
    return method, parse_params(args.method_param, target, "--method-param")
