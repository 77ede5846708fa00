"""``gradzip bits --model M --compressor C``: the bits per worker per iteration of one real
gradient of a model (:mod:`gradzip.experiments.bits`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_bits_parser(sub: Any) -> None:
    """Register ``gradzip bits`` on the CLI's subparsers."""
    from gradzip.models.paper import MODELS

    p_bits = sub.add_parser(
        "bits",
        help="bits per worker per iteration of a model's real gradient",
        description=(
            "With --model and --compressor: build the model (seeded), compute ONE real gradient "
            "on a random batch (no dataset), encode each parameter tensor with the compressor "
            "and print paper, wire (measured payload) and entropy bits in Kbit beside the "
            "Baseline 32n: Table 1 without training (the paper's Table 1 itself: `gradzip "
            "reproduce dqsg-table1`)."
        ),
    )
    p_bits.add_argument("--model", metavar="M", help=f"one of {', '.join(MODELS)}")
    p_bits.add_argument("--compressor", metavar="C", help="a registered compressor (gradzip list)")
    p_bits.add_argument(
        "--param",
        action="extend",
        nargs="+",
        metavar="KEY=VALUE",
        help="compressor parameter(s), typed by its signature (e.g. M=1 bucket_size=none)",
    )
    p_bits.add_argument("--seed", type=int, default=0, help="model, batch and key seed (default 0)")
    p_bits.add_argument(
        "--batch", type=int, default=8, help="examples in the gradient's batch (default 8)"
    )
    p_bits.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    # `gradzip bits table1` was removed in favour of `gradzip reproduce dqsg-table1`: caught
    # here so that old scripts get the new command, not argparse's "unrecognized arguments"
    p_bits.add_argument("removed_subcommand", nargs="?", help=argparse.SUPPRESS)
    p_bits.set_defaults(func=cmd_bits)


def cmd_bits(args: argparse.Namespace) -> int:
    from gradzip.cli.params import ParamError, compressor_params
    from gradzip.experiments.bits import UsageError, format_report, measure_bits, write_json

    if args.removed_subcommand == "table1":
        print(
            "gradzip bits table1 was removed: run `gradzip reproduce dqsg-table1`",
            file=sys.stderr,
        )
        return 2
    if args.removed_subcommand is not None:
        print(f"gradzip bits: unexpected argument {args.removed_subcommand!r}", file=sys.stderr)
        return 2
    if args.model is None or args.compressor is None:
        print("gradzip bits: give --model and --compressor", file=sys.stderr)
        return 2
    try:
        params = compressor_params(args.compressor, args.param or [])
        report = measure_bits(args.model, args.compressor, params, args.seed, args.batch)
    except (ParamError, UsageError) as err:
        print(f"gradzip: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        write_json(report, args.json)
    return 0
