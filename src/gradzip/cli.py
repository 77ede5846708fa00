"""The ``gradzip`` command line: ``gradzip list [compressors|experiments|models|schemes]``,
``gradzip bench codecs``, ``gradzip bench
collectives``, ``gradzip bench cluster``, ``gradzip bits table1``, ``gradzip bits --model M --compressor C``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gradzip.cli_help import parse, show_defaults
from gradzip.cli_reproduce import add_reproduce_parser
from gradzip.cli_train import add_train_parser
from gradzip.compressors import get, names
from gradzip.compressors.registry import summary


def _cmd_list(args: argparse.Namespace) -> int:
    if args.what == "experiments":
        from gradzip.cli_reproduce import print_experiments

        print_experiments()
        return 0
    if args.what == "models":
        from gradzip.experiments.models import MODELS, model_info

        width = max(len(m) for m in MODELS)
        for model in MODELS:
            info = model_info(model)
            count = sum(p.numel() for p in info.factory(0.0).parameters())
            shape = "x".join(map(str, info.input_shape))
            print(f"{model:<{width}}  {info.dataset}, input {shape}, {count:,} parameters")
        return 0
    if args.what == "schemes":
        from gradzip.schemes import VARIANTS

        for variant in VARIANTS:
            print(variant)
        return 0
    width = max(len(n) for n in names())
    for name in names():
        cls = get(name)
        print(f"{name:<{width}}  {summary(cls)}")
        if args.verbose:
            print(
                f"{'':<{width}}  codec id {cls.codec_id}; example: {cls(**cls.example_params).describe()}"
            )
    return 0


def _cmd_bench_codecs(args: argparse.Namespace) -> int:
    from gradzip.bench.codecs import run

    unknown = [n for n in args.only or [] if n not in names()]
    if unknown:
        print(f"gradzip: unknown compressor(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    if args.numel < 1:
        print("gradzip: --numel must be >= 1", file=sys.stderr)
        return 2
    if any(n < 0 for n in args.threads):
        print("gradzip: --threads must be >= 0 (0: every core)", file=sys.stderr)
        return 2
    run(
        numel=args.numel,
        repeat=args.repeat,
        only=args.only,
        json_path=args.json,
        threads=args.threads,
    )
    return 0


def _world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not sizes or any(p < 2 for p in sizes):
        raise argparse.ArgumentTypeError(f"world sizes must be integers >= 2, got {text!r}")
    return sizes


def _cmd_bench_collectives(args: argparse.Namespace) -> int:
    from gradzip.bench.collectives import run
    from gradzip.schemes import SCHEMES

    unknown = [n for n in args.schemes or [] if n not in SCHEMES]
    unknown += [n for n in args.compressors or [] if n not in names()]
    if unknown:
        print(f"gradzip: unknown scheme(s) or compressor(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    if args.numel < 1 or args.steps < 1:
        print("gradzip: --numel and --steps must be >= 1", file=sys.stderr)
        return 2
    run(
        world_sizes=args.world_sizes,
        numel=args.numel,
        steps=args.steps,
        schemes=args.schemes,
        compressors=args.compressors,
        baselines=not args.no_baselines,
        json_path=args.json,
    )
    return 0


def _rates(text: str) -> list[str]:
    from gradzip.bench.cluster_netns import parse_rate

    rates = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not rates:
        raise argparse.ArgumentTypeError("give at least one rate (e.g. 100mbit,1gbit,none)")
    for rate in rates:
        try:
            parse_rate(rate)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return rates


def _cmd_bench_cluster(args: argparse.Namespace) -> int:
    from gradzip.bench.cluster import main
    from gradzip.bench.cluster_target import Target

    if args.steps < 1 or args.warmup < 2 or args.timeout <= 0:
        print("gradzip: --steps must be >= 1, --warmup >= 2, --timeout > 0", file=sys.stderr)
        return 2
    if args.lr is not None and not args.lr > 0:
        print("gradzip: --lr must be > 0", file=sys.stderr)
        return 2
    target = None
    if args.target_loss is not None:
        if not 1 <= args.window <= args.steps or not args.target_loss > 0:
            print("gradzip: --window must be in [1, --steps], --target-loss > 0", file=sys.stderr)
            return 2
        target = Target(args.target_loss, args.window, args.curves_png)
    return main(
        world_sizes=args.world_sizes,
        rates=args.rates,
        model=args.model,
        steps=args.steps,
        warmup=args.warmup,
        variant_names=args.variants,
        timeout=args.timeout,
        json_path=args.json,
        png_path=args.png,
        data=args.data,
        threads=args.threads,
        target=target,
        lr=args.lr,
    )


def _cmd_bits_table1(args: argparse.Namespace) -> int:
    from gradzip.tables import format_table1, table1

    print(format_table1(table1()))
    return 0


def _cmd_bits(args: argparse.Namespace) -> int:
    from gradzip.experiments.bits import (
        UsageError,
        format_report,
        measure_bits,
        parse_params,
        write_json,
    )

    if args.model is None or args.compressor is None:
        print("gradzip bits: give --model and --compressor, or a table (table1)", file=sys.stderr)
        return 2
    try:
        params = parse_params(args.compressor, args.param or [])
        report = measure_bits(args.model, args.compressor, params, args.seed, args.batch)
    except UsageError as err:
        print(f"gradzip: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        write_json(report, args.json)
    return 0


def _add_cluster_parser(bench_sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p_cluster = bench_sub.add_parser(
        "cluster",
        help="DDP training steps on an emulated bandwidth-limited cluster (needs root)",
        description=(
            "Builds a cluster of network namespaces (one per rank, veth pairs through a bridge "
            "namespace, tc tbf at the rate on both ends of every link), runs P gloo ranks with "
            "DDP and compares no communication, fp32 all-reduce, fp16_compress_hook, PowerSGD "
            "rank 1 and 4 and gradzip configurations, their steps interleaved. Prints step ms, "
            "MB sent per rank per step (measured on the veth) and the speedup over fp32; "
            "writes a PNG. Needs root and iproute2 (exit 2 otherwise); always removes its "
            "namespaces."
        ),
    )
    p_cluster.add_argument(
        "--world-sizes", type=_world_sizes, default="2,4", metavar="P,P,..",
        help="numbers of ranks, comma-separated",
    )  # fmt: skip
    p_cluster.add_argument(
        "--rates", type=_rates, default="100mbit,1gbit,none", metavar="R,R,..",
        help="link rates (tc units: kbit, mbit, gbit; none = no limit), comma-separated",
    )  # fmt: skip
    p_cluster.add_argument("--model", choices=("mlp-4096", "fc-300-100"), default="mlp-4096")
    p_cluster.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    p_cluster.add_argument(
        "--warmup", type=int, default=2, help="untimed steps first (>= 2: PowerSGD's start)"
    )
    p_cluster.add_argument(
        "--variants", nargs="+", metavar="NAME",
        help="only these variants (none fp32 fp16_hook powersgd_r1 ... gradzip:C[+ef]:SCHEME)",
    )  # fmt: skip
    p_cluster.add_argument("--data", choices=("mnist", "synthetic"), default="mnist")
    p_cluster.add_argument(
        "--threads", type=int, help="torch threads per rank (default: cores / P, at least 1)"
    )
    p_cluster.add_argument(
        "--timeout", type=float, default=1800.0,
        help="seconds allowed to the ranks of one world size and rate (and each collective)",
    )  # fmt: skip
    p_cluster.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p_cluster.add_argument(
        "--png", metavar="PATH", default="gradzip-cluster.png", help="the plot's path"
    )
    p_cluster.add_argument("--lr", type=float, help="SGD learning rate (default: the model's)")
    p_cluster.add_argument(
        "--target-loss", type=float, metavar="L",
        help="time to a target loss: each variant trains until the mean loss of its last "
        "--window steps is at most L (or --steps run out); prints steps and seconds to it",
    )  # fmt: skip
    p_cluster.add_argument(
        "--window", type=int, default=10, help="steps in the target loss's mean (default 10)"
    )
    p_cluster.add_argument(
        "--curves-png", metavar="PATH", default="gradzip-cluster-curves.png",
        help="with --target-loss: loss against training time, a line per variant",
    )  # fmt: skip
    p_cluster.set_defaults(func=_cmd_bench_cluster)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradzip", description="Gradient compressors that emit real bytes."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p_list = sub.add_parser(
        "list", help="list the compressors (default), experiments, models or schemes"
    )
    p_list.add_argument(
        "what",
        nargs="?",
        default="compressors",
        choices=("compressors", "experiments", "models", "schemes"),
        help="what to list (default: compressors)",
    )
    p_list.add_argument("-v", "--verbose", action="store_true", help="show ids and example configs")
    p_list.set_defaults(func=_cmd_list)

    p_bench = sub.add_parser("bench", help="benchmarks that print measured figures")
    bench_sub = p_bench.add_subparsers(dest="bench", required=True)
    p_codecs = bench_sub.add_parser("codecs", help="encode/decode throughput and bits/coordinate")
    p_codecs.add_argument("--numel", type=int, default=1 << 24, help="coordinates (default 2^24)")
    p_codecs.add_argument(
        "--repeat", type=int, default=3, help="timed runs per figure (best is kept)"
    )
    p_codecs.add_argument(
        "--only", nargs="+", metavar="NAME", help="benchmark only these compressors"
    )
    p_codecs.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    p_codecs.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1],
        metavar="N",
        help="torch and numba threads, one run per count, 0 = every core (default 1)",
    )
    p_codecs.set_defaults(func=_cmd_bench_codecs)
    p_coll = bench_sub.add_parser(
        "collectives",
        help="bytes and ms per rank and step of every scheme on real gloo processes",
        description=(
            "Every compatible scheme x compressor (onebit under error feedback), plus fp32 "
            "all-reduce and DDP's fp16_compress_hook as baselines, on P real gloo processes on "
            "127.0.0.1 (one spawn per P). Bytes per rank and step are counted by the transport "
            "(payloads + 8-byte length prefixes); the baselines' bytes are the ring all-reduce "
            "formula and are marked so. At the defaults (2^20 elements, 3 timed steps, "
            "P = 2,4,8) it takes about 2.5 minutes on 2 cores."
        ),
    )
    p_coll.add_argument(
        "--world-sizes",
        type=_world_sizes,
        default=[2, 4, 8],
        metavar="P,P,..",
        help="numbers of processes, comma-separated (default 2,4,8)",
    )
    p_coll.add_argument(
        "--numel", type=int, default=1 << 20, help="float32 elements per gradient (default 2^20)"
    )
    p_coll.add_argument(
        "--steps", type=int, default=3, help="timed steps per case, after 1 warm-up (default 3)"
    )
    p_coll.add_argument("--schemes", nargs="+", metavar="NAME", help="only these schemes")
    p_coll.add_argument(
        "--compressors",
        nargs="+",
        metavar="NAME",
        help="compressors to pair with the schemes (default dqsg ndqsg qsgd onebit)",
    )
    p_coll.add_argument(
        "--no-baselines", action="store_true", help="skip fp32 all-reduce and the DDP fp16 hook"
    )
    p_coll.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p_coll.set_defaults(func=_cmd_bench_collectives)
    _add_cluster_parser(bench_sub)

    from gradzip.experiments.models import MODELS

    p_bits = sub.add_parser(
        "bits",
        help="bits per worker per iteration: of a model's real gradient, or the papers' tables",
        description=(
            "With --model and --compressor: build the model (seeded), compute ONE real gradient "
            "on a random batch (no dataset), encode each parameter tensor with the compressor "
            "and print paper, wire (measured payload) and entropy bits in Kbit beside the "
            "Baseline 32n: Table 1 without training. With a table name: print that table."
        ),
    )
    p_bits.add_argument("--model", metavar="M", help=f"one of {', '.join(MODELS)}")
    p_bits.add_argument("--compressor", metavar="C", help="a registered compressor (gradzip list)")
    p_bits.add_argument(
        "--param",
        action="extend",
        nargs="+",
        metavar="KEY=VALUE",
        help="compressor parameter(s), typed by its signature (e.g. M=1, bucket_size=none)",
    )
    p_bits.add_argument("--seed", type=int, default=0, help="model, batch and key seed (default 0)")
    p_bits.add_argument(
        "--batch", type=int, default=8, help="examples in the gradient's batch (default 8)"
    )
    p_bits.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    p_bits.set_defaults(func=_cmd_bits)
    bits_sub = p_bits.add_subparsers(dest="table", required=False)
    p_t1 = bits_sub.add_parser("table1", help="Table 1 of the DQSG paper from parameter shapes")
    p_t1.set_defaults(func=_cmd_bits_table1)
    add_train_parser(sub)
    add_reproduce_parser(sub)
    show_defaults(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
