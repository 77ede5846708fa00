"""The ``gradzip`` command line: ``gradzip list``, ``gradzip bench codecs``, ``gradzip bits table1``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gradzip.compressors import get, names
from gradzip.compressors.registry import summary


def _cmd_list(args: argparse.Namespace) -> int:
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
    run(numel=args.numel, repeat=args.repeat, only=args.only, json_path=args.json)
    return 0


def _cmd_bits_table1(args: argparse.Namespace) -> int:
    from gradzip.tables import format_table1, table1

    print(format_table1(table1()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradzip", description="Gradient compressors that emit real bytes."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p_list = sub.add_parser("list", help="list the registered compressors")
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
    p_codecs.set_defaults(func=_cmd_bench_codecs)

    p_bits = sub.add_parser("bits", help="bit counts of the papers' tables")
    bits_sub = p_bits.add_subparsers(dest="table", required=True)
    p_t1 = bits_sub.add_parser("table1", help="Table 1 of the DQSG paper from parameter shapes")
    p_t1.set_defaults(func=_cmd_bits_table1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
