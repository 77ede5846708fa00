"""``gradzip tune``: measure the link, the codecs and the model here, print the variant to use
(:mod:`gradzip_lab.tune_run`). Under ``torchrun`` every rank runs it; offline, ``--world-size``
and ``--link-rate`` stand for the link."""

from __future__ import annotations

import argparse
from typing import Any

from gradzip.cli.help import fail

TUNE = "gradzip tune"


def add_tune_parser(sub: Any) -> None:
    """Register ``gradzip tune`` on the CLI's subparsers."""
    p = sub.add_parser(
        "tune",
        help="measure your link, codecs and model; print the variant to use",
        description=(
            "Run under torchrun on your machines (every rank): times all-gathers of 1-64 MB to "
            "fit the link's alpha and beta, the codecs on the model's gradient shapes and a "
            "forward/backward, then ranks every variant by the scaling model's predicted step "
            "time (gradzip bench project) and prints the best as a DDP hook snippet. Offline: "
            "give --world-size and --link-rate. Takes well under a minute."
        ),
    )
    p.add_argument("--model", choices=("mlp-4096", "fc-300-100", "resnet20"), default="mlp-4096",
                   help="the model (your own: gradzip_lab.tune.recommend)")  # fmt: skip
    p.add_argument("--world-size", type=int, help="ranks (offline; with --link-rate)")
    p.add_argument("--link-rate", type=float, metavar="GBIT", help="Gbit/s (offline)")
    p.add_argument("--alpha-us", type=float, default=30.0, help="offline latency, microseconds")
    p.add_argument("--ranks-per-node", type=int, default=None, metavar="K",
                   help="ranks a node: with K > 1 dividing the world size into >= 2 nodes, "
                   "hierarchical[ranks_per_node=K] is a candidate (default: torchrun's "
                   "LOCAL_WORLD_SIZE, else 1)")  # fmt: skip
    p.add_argument("--intra-link-rate", type=float, default=None, metavar="GBIT",
                   help="Gbit/s inside a node, for the hierarchical candidate (default: the "
                   "link's rate)")  # fmt: skip
    p.add_argument("--backend", default="gloo", help="torch.distributed backend under torchrun")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    offline = args.world_size is not None or args.link_rate is not None
    if offline and (args.world_size is None or args.link_rate is None):
        return fail(TUNE, "give both --world-size and --link-rate (or neither, under torchrun)")
    if offline and (args.world_size < 2 or not args.link_rate > 0 or args.alpha_us < 0):
        return fail(TUNE, "--world-size must be >= 2, --link-rate > 0, --alpha-us >= 0")
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        return fail(TUNE, f"--ranks-per-node must be >= 1, got {args.ranks_per_node}")
    if args.intra_link_rate is not None and not args.intra_link_rate > 0:
        return fail(TUNE, f"--intra-link-rate must be > 0, got {args.intra_link_rate}")
    nodes = {"local_world_size": args.ranks_per_node, "intra_gbit": args.intra_link_rate}
    from gradzip_lab.tune_run import tune, tune_under_torchrun  # imports torch: after the checks

    try:
        if offline:
            tune(args.model, world_size=args.world_size, link_gbit=args.link_rate,
                 alpha_s=args.alpha_us * 1e-6, **nodes)  # fmt: skip
        else:
            tune_under_torchrun(args.model, args.backend, **nodes)
    except ValueError as err:
        return fail(TUNE, str(err))
    return 0
