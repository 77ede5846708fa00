"""``gradzip reproduce``: recompute a table or figure of the seed papers (see
:mod:`gradzip_lab.reproduce`)."""

from __future__ import annotations

import argparse
from typing import Any

from gradzip.cli.help import fail
from gradzip_lab.cli.experiment_ids import experiments

REPRODUCE = "gradzip reproduce"


def add_reproduce_parser(sub: Any) -> None:
    """Register ``gradzip reproduce`` on the CLI's subparsers."""
    p = sub.add_parser(
        "reproduce",
        help="recompute a table or figure of the papers and compare with their numbers",
        description=(
            "Run one experiment and write <out>/<id>/report.md (the paper's value, ours, the "
            "deviation), result.json and, for curves, accuracy.png. `gradzip reproduce --list` "
            "(or `gradzip reproduce list`) shows the ids."
        ),
    )
    p.add_argument("id", nargs="?", help="experiment id (see --list)")
    p.add_argument("--list", action="store_true", help="list the experiment ids and exit")
    p.add_argument("--quick", action="store_true", help="scaled-down run (about a minute)")
    p.add_argument("--out", default="reproduce", help="output directory (default: reproduce)")
    p.add_argument(
        "--seeds",
        type=_seed_count,
        metavar="N",
        help=(
            "run seeds 0..N-1 (each into <out>/<id>/seed-<seed>/) and report every row's mean "
            "± sd and paired t-tests of the methods (for ids whose run takes a seed; seed 0 "
            "is the run without --seeds)"
        ),
    )
    p.set_defaults(func=cmd_reproduce)


def _seed_count(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"--seeds needs at least 1, not {n}")
    return n


def print_experiments() -> None:
    """One line per experiment id: what it reproduces and how long ``--quick`` takes."""
    from gradzip_lab.reproduce import EXPERIMENTS

    width = max(len(e) for e in EXPERIMENTS)
    for e in EXPERIMENTS.values():
        root = " (needs root)" if e.needs_root else ""
        print(f"{e.id:<{width}}  {e.summary} (--quick: about {e.quick_seconds} s){root}")


def cmd_reproduce(args: argparse.Namespace) -> int:
    if args.list or args.id in (None, "list"):
        print_experiments()
        return 0
    if args.id not in experiments():
        return fail(
            REPRODUCE, f"unknown experiment {args.id!r}; choose one of {', '.join(experiments())}"
        )
    # imported once the id is known to exist: the experiments import torch
    import gradzip_lab.reproduce as registry
    from gradzip.data.files import DatasetUnavailableError
    from gradzip_lab.reproduce.timing_setup import ClusterUnavailableError

    seeds = None if args.seeds is None else list(range(args.seeds))
    if seeds is not None and not registry.EXPERIMENTS[args.id].takes_seed():
        return fail(REPRODUCE, f"{args.id} takes no seed; run it without --seeds")
    try:
        outcome = registry.reproduce(args.id, args.out, quick=args.quick, seeds=seeds)
    except DatasetUnavailableError as err:  # one line: which data set, how to supply it
        return fail(REPRODUCE, str(err), status=1)
    except ClusterUnavailableError as err:  # one line: needs root, or iproute2
        return fail(REPRODUCE, str(err))
    print(f"{args.id}: {outcome.seconds:.1f} s; report in {args.out}/{args.id}/report.md")
    return 0
