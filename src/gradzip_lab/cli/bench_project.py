"""``gradzip bench project``: the scaling model's options (:mod:`gradzip_lab.bench.project`)."""

from __future__ import annotations

import argparse
from typing import Any

from gradzip.cli.help import fail

PROJECT = "gradzip bench project"


def _numbers(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated numbers, got {text!r}"
            ) from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected numbers > 0, got {text!r}")
        return values

    return parse


def add_project_parser(bench_sub: Any) -> None:
    """Register ``gradzip bench project``."""
    p = bench_sub.add_parser(
        "project",
        help="predict step time per variant to P = 1,024 and 400 Gbit/s (alpha-beta model)",
        description=(
            "Predicts each variant's step time from an alpha-beta model of its messages "
            "(rounds x alpha + bytes / beta, bytes from real payloads on the model's parameter "
            "shapes), the codecs' speeds measured here (or --speeds) and the compute time "
            "(measured, or --compute-ms). Prints a table, the winner at each rate and P, and "
            "draws the predicted speed-up over fp32 against P. With --validate, predicts the "
            "rows of `gradzip bench cluster --json` files and prints the error."
        ),
    )
    p.add_argument(
        "--model",
        choices=("mlp-4096", "fc-300-100", "resnet20"),
        default="mlp-4096",
        help="the model whose parameter shapes and compute are measured",
    )
    p.add_argument("--variants", nargs="+", metavar="NAME", help="fp32 fp16_hook powersgd_rN "
                   "gradzip:C[K=V][+ef]:SCHEME (ring_allreduce, hierarchical[ranks_per_node=K], ...) "
                   "hier[K]:gradzip:... (default: a set of each)")  # fmt: skip
    p.add_argument("--world-sizes", type=_numbers(int), default=None, metavar="P,P,..",
                   help="ranks (default 2,4,...,1024)")  # fmt: skip
    p.add_argument("--rates", type=_numbers(float), default=None, metavar="G,G,..",
                   help="inter-node link rates in Gbit/s (default 1,10,25,100,400)")  # fmt: skip
    p.add_argument("--table-world-sizes", type=_numbers(int), default=[2, 8, 64, 1024],
                   metavar="P,P,..", help="the P values the table prints")  # fmt: skip
    p.add_argument("--table-rates", type=_numbers(float), default=[1.0, 100.0],
                   metavar="G,G,..", help="the rates the table prints")  # fmt: skip
    p.add_argument("--alpha-us", type=float, default=30.0, help="latency a message, microseconds")
    p.add_argument("--alltoall-efficiency", type=float, default=1.0, metavar="E",
                   help="an all-to-all's byte rate over a ring's on the link, 0 < E <= 1 "
                        "(`gradzip tune` measures it; default 1)")  # fmt: skip
    p.add_argument("--intra-gbit", type=float, default=800.0,
                   help="intra-node link of the hier[K] and hierarchical variants, Gbit/s")  # fmt: skip
    p.add_argument("--overlap", type=float, default=0.0,
                   help="fraction of backward that hides communication, 0..1 (default 0)")  # fmt: skip
    p.add_argument("--compute-ms", type=float, help="forward+backward ms (default: measured)")
    p.add_argument("--speeds", metavar="PATH",
                   help="codec speeds from --save-speeds or `gradzip bench codecs --json`")  # fmt: skip
    p.add_argument("--save-speeds", metavar="PATH", help="write the speeds this run used")
    p.add_argument("--png", metavar="PATH", default="gradzip-project.png", help="the figure")
    p.add_argument("--validate", nargs="+", metavar="FILE.json",
                   help="predict the rows of these `gradzip bench cluster --json` files")  # fmt: skip
    p.add_argument("--all-rows", action="store_true",
                   help="with --validate, also score rows superseded by a newer measurement of "
                        "the same configuration (default: each configuration's newest only)")  # fmt: skip
    p.set_defaults(func=cmd_bench_project)


def cmd_bench_project(args: argparse.Namespace) -> int:
    if args.alpha_us < 0 or args.intra_gbit <= 0 or not 0 <= args.overlap <= 1:
        return fail(PROJECT, "--alpha-us must be >= 0, --intra-gbit > 0, --overlap in [0, 1]")
    if not 0 < args.alltoall_efficiency <= 1:
        return fail(
            PROJECT, f"--alltoall-efficiency must be in (0, 1], got {args.alltoall_efficiency}"
        )
    if args.compute_ms is not None and not args.compute_ms > 0:
        return fail(PROJECT, "--compute-ms must be > 0")
    if args.world_sizes and min(args.world_sizes) < 2:
        return fail(PROJECT, "--world-sizes must be >= 2")
    from gradzip_lab.bench.project import run  # imports torch: after the options are checked
    from gradzip_lab.bench.project_report import RATES_GBIT, WORLD_SIZES

    try:
        return run(
            model=args.model,
            variants=args.variants,
            world_sizes=args.world_sizes or WORLD_SIZES,
            rates_gbit=args.rates or RATES_GBIT,
            table_world_sizes=args.table_world_sizes,
            table_rates=args.table_rates,
            alpha_s=args.alpha_us * 1e-6,
            alltoall_efficiency=args.alltoall_efficiency,
            intra_gbit=args.intra_gbit,
            overlap=args.overlap,
            compute_ms=args.compute_ms,
            png_path=args.png,
            validate_paths=args.validate or (),
            speeds_path=args.speeds,
            save_speeds_path=args.save_speeds,
            newest_only=not args.all_rows,
        )
    except (ValueError, OSError) as err:
        return fail(PROJECT, str(err))
