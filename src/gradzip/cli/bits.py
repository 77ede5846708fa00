"""``gradzip bits --model M --compressor C``: the bits per worker per iteration of one real
gradient of a model (:mod:`gradzip.experiments.gradient_bits`)."""

from __future__ import annotations

import argparse
from typing import Any

from gradzip.cli.catalog import compressors, models
from gradzip.cli.help import fail

BITS = "gradzip bits"


def add_bits_parser(sub: Any) -> None:
    """Register ``gradzip bits`` on the CLI's subparsers."""
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
    p_bits.add_argument("--model", metavar="M", help=f"one of {', '.join(models())} (required)")
    p_bits.add_argument(
        "--compressor", metavar="C", help="a registered compressor, `gradzip list` (required)"
    )
    p_bits.add_argument(
        "--param",
        action="extend",
        nargs="+",
        metavar="KEY=VALUE",
        help="compressor parameter(s), typed by its signature (e.g. M=1 bucket_size=none; "
        "default: the compressor's defaults)",
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
    if args.removed_subcommand == "table1":
        return fail(BITS, "`gradzip bits table1` was removed: run `gradzip reproduce dqsg-table1`")
    if args.removed_subcommand is not None:
        return fail(BITS, f"unexpected argument {args.removed_subcommand!r}")
    if args.model is None or args.compressor is None:
        return fail(BITS, "give --model and --compressor")
    # the messages of gradzip.experiments.gradient_bits, before it is imported
    if args.model not in models():
        return fail(BITS, f"unknown model {args.model!r}; choices: {', '.join(models())}")
    if args.compressor not in compressors():
        return fail(
            BITS, f"unknown compressor {args.compressor!r}; choices: {', '.join(compressors())}"
        )
    if args.batch < 1:
        return fail(BITS, f"batch must be >= 1, got {args.batch}")
    # imported once the options are checked: these import torch
    from gradzip.cli.params import ParamError, compressor_params
    from gradzip.experiments.gradient_bits import (
        UsageError,
        format_report,
        measure_bits,
        write_json,
    )

    try:
        params = compressor_params(args.compressor, args.param or [])
        report = measure_bits(args.model, args.compressor, params, args.seed, args.batch)
    except (ParamError, UsageError) as err:
        return fail(BITS, str(err))
    print(format_report(report))
    if args.json:
        write_json(report, args.json)
    return 0
