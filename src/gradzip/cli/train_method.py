"""The training-method options of ``gradzip train``: ``--method NAME`` and ``--method-param
KEY=VALUE`` (:mod:`gradzip.experiments.methods`), and the deprecated ``--algorithm`` and
``--qesgd-*`` options they replace."""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields
from typing import Any

from gradzip.cli.params import Target, describe, parse_params
from gradzip.experiments.config import DEFAULT_METHOD

#: the deprecated ``--qesgd-*`` options: their qesgd option, type and choices
_QESGD_ALIASES: dict[str, tuple[str, type, tuple[str, ...] | None]] = {
    "qesgd_bits": ("bits", int, None),
    "qesgd_c": ("c", float, None),
    "qesgd_output": ("output", str, ("average", "last")),
    "qesgd_bucket_size": ("bucket_size", int, None),
    "qesgd_norm_samples": ("norm_samples", int, None),
}
#: the methods the deprecated ``--algorithm`` names
_ALGORITHMS = {"sgd": DEFAULT_METHOD, "qesgd": "qesgd"}
#: ``gradzip train`` destinations of the deprecated options, by the config field they set
DEPRECATED_FIELDS = {"algorithm": "method", **dict.fromkeys(_QESGD_ALIASES, "method_options")}


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
    group.add_argument("--algorithm", choices=list(_ALGORITHMS), default=None, help=hidden)
    for dest, (_, kind, choices) in _QESGD_ALIASES.items():
        flag = "--" + dest.replace("_", "-")
        group.add_argument(flag, type=kind, choices=choices, default=None, help=hidden)


def method_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The method and its options given on the command line (deprecated aliases included,
    each noted on standard error)."""
    from gradzip.experiments.methods import get_method

    method = args.method
    if args.algorithm is not None:
        method = _ALGORITHMS[args.algorithm]
        _deprecated(f"--algorithm {args.algorithm}", f"--method {method}")
    options: dict[str, Any] = {}
    for dest, (key, _, _) in _QESGD_ALIASES.items():
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
