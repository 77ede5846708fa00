"""The training-method options of ``gradzip train``: ``--method NAME`` and ``--method-param
KEY=VALUE`` (:mod:`gradzip.experiments.methods`), and the deprecated ``--algorithm`` and
``--qesgd-*`` options they replace.

Nothing here imports the methods (they import torch) while the parser is built: ``--method``
is checked against the names of :mod:`gradzip.cli.catalog`, the methods' parameters are described
only when ``--help`` is printed, and the deprecated options are read as text and converted by
the qesgd options' annotations once the command runs."""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields
from typing import Any

from gradzip.cli.catalog import methods
from gradzip.cli.help import describe_when_asked
from gradzip.experiments.config import DEFAULT_METHOD, OLD_ALGORITHMS, OLD_QESGD_FIELDS

#: ``gradzip train`` destinations of the deprecated options, by the config field they set
DEPRECATED_FIELDS = {"algorithm": "method", **dict.fromkeys(OLD_QESGD_FIELDS, "method_options")}


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
    """``--method``, ``--method-param`` and the hidden deprecated aliases."""
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
    hidden = argparse.SUPPRESS
    group.add_argument("--algorithm", choices=list(OLD_ALGORITHMS), default=None, help=hidden)
    for dest in OLD_QESGD_FIELDS:
        group.add_argument("--" + dest.replace("_", "-"), default=None, help=hidden)


def method_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The method and its options given on the command line (deprecated aliases included,
    each noted on standard error)."""
    from gradzip.cli.params import ParamError, Target, convert, describe, parse_params
    from gradzip.experiments.methods import get_method

    method = args.method
    if args.algorithm is not None:
        method = OLD_ALGORITHMS[args.algorithm]
        _deprecated(f"--algorithm {args.algorithm}", f"--method {method}")
    options: dict[str, Any] = {}
    hints = Target.of_dataclass("qesgd", get_method("qesgd").options).hints
    for dest, key in OLD_QESGD_FIELDS.items():
        text = getattr(args, dest)
        if text is not None:
            flag = "--" + dest.replace("_", "-")
            try:
                options[key] = convert(text, hints[key])
            except ValueError:
                raise ParamError(f"{flag} expects {describe(hints[key])}, got {text!r}") from None
            _deprecated(f"{flag} {text}", f"--method-param {key}={text}")
    target = Target.of_dataclass(f"method {method!r}", get_method(method).options)
    options.update(parse_params(args.method_param, target, "--method-param"))
    return method, options


def _deprecated(old: str, new: str) -> None:
    print(f"gradzip train: {old} is deprecated; use {new}", file=sys.stderr)
