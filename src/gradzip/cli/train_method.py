"""The training-method options of ``gradzip train``: ``--method NAME`` and ``--method-param
KEY=VALUE`` (:mod:`gradzip.experiments.methods`), and the deprecated ``--algorithm`` and
``--qesgd-*`` options they replace."""

from __future__ import annotations

import argparse
import sys
import types
import typing
from dataclasses import MISSING, fields
from typing import Any

from gradzip.cli.params import Target, describe, parse_params
from gradzip.experiments.config import DEFAULT_METHOD, OLD_ALGORITHMS, OLD_QESGD_FIELDS

#: ``gradzip train`` destinations of the deprecated options, by the config field they set
DEPRECATED_FIELDS = {"algorithm": "method", **dict.fromkeys(OLD_QESGD_FIELDS, "method_options")}


def methods_help() -> str:
    """One paragraph per registered method: its name, summary and parameters."""
    from gradzip.experiments.methods import METHODS

    parts = []
    for method in METHODS.values():
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
    from gradzip.experiments.methods import METHODS

    group = parser.add_argument_group(
        "training method (--method NAME, --method-param KEY=VALUE)", methods_help()
    )
    group.add_argument(
        "--method",
        choices=list(METHODS),
        default=DEFAULT_METHOD,
        help="what the ranks exchange and how the parameters follow",
    )
    group.add_argument(
        "--method-param",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the method (repeatable), e.g. --method-param bits=4",
    )
    hidden = argparse.SUPPRESS
    group.add_argument("--algorithm", choices=list(OLD_ALGORITHMS), default=None, help=hidden)
    hints = Target.of_dataclass("qesgd", METHODS["qesgd"].options).hints
    for dest, key in OLD_QESGD_FIELDS.items():
        kind, choices = _alias_type(hints[key])
        flag = "--" + dest.replace("_", "-")
        group.add_argument(flag, type=kind, choices=choices, default=None, help=hidden)


def _alias_type(hint: Any) -> tuple[type, tuple[Any, ...] | None]:
    """The argparse ``type`` and ``choices`` of a deprecated ``--qesgd-*`` option, from its
    qesgd option's annotation: a ``Literal`` is its values, ``X | None`` is ``X``."""
    if typing.get_origin(hint) is typing.Literal:
        return str, typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(m for m in typing.get_args(hint) if m is not type(None))
    return hint, None


def method_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The method and its options given on the command line (deprecated aliases included,
    each noted on standard error)."""
    from gradzip.experiments.methods import get_method

    method = args.method
    if args.algorithm is not None:
        method = OLD_ALGORITHMS[args.algorithm]
        _deprecated(f"--algorithm {args.algorithm}", f"--method {method}")
    options: dict[str, Any] = {}
    for dest, key in OLD_QESGD_FIELDS.items():
        value = getattr(args, dest)
        if value is not None:
            options[key] = value
            flag = "--" + dest.replace("_", "-")
            _deprecated(f"{flag} {value}", f"--method-param {key}={value}")
    target = Target.of_dataclass(f"method {method!r}", get_method(method).options)
    options.update(parse_params(args.method_param, target, "--method-param"))
    return method, options


def _deprecated(old: str, new: str) -> None:
    print(f"gradzip train: {old} is deprecated; use {new}", file=sys.stderr)
