"""``gradzip bench codecs|collectives|cluster|project|hook|sim-ranks``: benchmarks that print measured
figures (the last two, and ``codecs --device cuda``, for one GPU: ``cli/bench_device.py``)."""

from __future__ import annotations

import argparse
from typing import Any

from gradzip.cli.catalog import compressors, schemes
from gradzip.cli.help import fail
from gradzip_lab.cli.bench_device import add_device_parsers
from gradzip_lab.cli.bench_project import add_project_parser

CODECS = "gradzip bench codecs"
COLLECTIVES = "gradzip bench collectives"
CLUSTER = "gradzip bench cluster"
#: the real workloads (the keys of gradzip_lab.bench.cluster_workloads.WORKLOADS, named here so
#: that parsing the options imports no torch)
REAL_MODELS = ("resnet20", "transformer-lm")
#: held-out evaluations every this many timed steps unless --eval-every says
DEFAULT_EVAL_EVERY = 20


def add_bench_parser(sub: Any) -> None:
    """Register ``gradzip bench`` and its benchmarks on the CLI's subparsers."""
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
    p_codecs.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: the CPU table against memcpy (default); cuda: the codecs on the GPU against "
        "its clone() bandwidth (host work at the first --threads count)",
    )
    p_codecs.set_defaults(func=cmd_bench_codecs)
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
    p_coll.set_defaults(func=cmd_bench_collectives)
    add_cluster_parser(bench_sub)
    add_project_parser(bench_sub)
    add_device_parsers(bench_sub)


def cmd_bench_codecs(args: argparse.Namespace) -> int:
    unknown = [n for n in args.only or [] if n not in compressors()]
    if unknown:
        return fail(CODECS, f"unknown compressor(s): {', '.join(unknown)}")
    if args.numel < 1 or args.repeat < 1:
        return fail(CODECS, "--numel and --repeat must be >= 1")
    if any(n < 0 for n in args.threads):
        return fail(CODECS, "--threads must be >= 0 (0: every core)")
    from gradzip_lab.bench import devices  # imports torch: after the options are checked

    problem = devices.missing_device(args.device)
    if problem:
        return fail(CODECS, problem)
    if args.device != "cpu":
        from gradzip_lab.bench import codecs_device

        codecs_device.run(
            devices.resolve(args.device),
            numel=args.numel,
            repeat=args.repeat,
            only=args.only,
            json_path=args.json,
            threads=args.threads[0],
        )
        return 0
    from gradzip_lab.bench.codecs import run

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


def cmd_bench_collectives(args: argparse.Namespace) -> int:
    unknown = [n for n in args.schemes or [] if n not in schemes()]
    unknown += [n for n in args.compressors or [] if n not in compressors()]
    if unknown:
        return fail(COLLECTIVES, f"unknown scheme(s) or compressor(s): {', '.join(unknown)}")
    if args.numel < 1 or args.steps < 1:
        return fail(COLLECTIVES, "--numel and --steps must be >= 1")
    from gradzip_lab.bench.collectives import run  # imports torch: after the options are checked

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
    from gradzip_lab.bench.cluster_netns import parse_rate

    rates = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not rates:
        raise argparse.ArgumentTypeError("give at least one rate (e.g. 100mbit,1gbit,none)")
    for rate in rates:
        try:
            parse_rate(rate)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return rates


def cmd_bench_cluster(args: argparse.Namespace) -> int:
    timeout_ok = args.timeout is None or args.timeout > 0
    if args.steps < 1 or args.warmup < 2 or not timeout_ok or args.rounds < 1:
        return fail(CLUSTER, "--steps must be >= 1, --warmup >= 2, --timeout > 0, --rounds >= 1")
    if args.ranks_per_node < 1:
        return fail(CLUSTER, f"--ranks-per-node must be >= 1, got {args.ranks_per_node}")
    if args.ring_gather_from is not None and args.ring_gather_from < 0:
        return fail(CLUSTER, f"--ring-gather-from must be >= 0 bytes, got {args.ring_gather_from}")
    if args.segment_from is not None and args.segment_from < 1:
        return fail(CLUSTER, f"--segment-from must be >= 1 byte, got {args.segment_from}")
    uneven = [p for p in args.world_sizes if p % args.ranks_per_node]
    if uneven:
        return fail(
            CLUSTER,
            f"world size(s) {', '.join(map(str, uneven))} are no multiple of --ranks-per-node "
            f"{args.ranks_per_node}: every node holds the same number of ranks",
        )
    if args.lr is not None and not args.lr > 0:
        return fail(CLUSTER, "--lr must be > 0")
    # [CHOICE] a model without a held-out set refuses the held-out options instead of ignoring
    # them or growing one: the MLPs' --target-loss is their training loss (a window's mean), and
    # a held-out split would change what their rows have always measured
    held_out_only = [
        flag
        for flag, given in (
            ("--eval-every", args.eval_every is not None),
            ("--target-accuracy", args.target_accuracy is not None),
            ("--seeds", args.seeds != 1),
        )
        if given
    ]
    if args.model not in REAL_MODELS and held_out_only:
        return fail(
            CLUSTER,
            f"{', '.join(held_out_only)}: --model {args.model} has no held-out set; only "
            f"{' and '.join(REAL_MODELS)} evaluate one (the MLPs' --target-loss is their "
            "training loss over --window steps)",
        )
    target_ok = (
        1 <= args.window <= args.steps and args.target_loss is not None and args.target_loss > 0
    )
    if args.target_loss is not None and not target_ok and args.model not in REAL_MODELS:
        return fail(CLUSTER, "--window must be in [1, --steps], --target-loss > 0")
    from gradzip_lab.bench.cluster import main  # imports torch: after the options are checked
    from gradzip_lab.bench.cluster_heldout import HeldoutTarget
    from gradzip_lab.bench.cluster_target import Target
    from gradzip_lab.bench.cluster_workloads import WORKLOADS

    target, heldout = None, None
    if args.model in WORKLOADS:  # --target-loss is held out for these
        try:
            every = DEFAULT_EVAL_EVERY if args.eval_every is None else args.eval_every
            heldout = HeldoutTarget(every, args.target_accuracy, args.target_loss, args.seeds,
                                    args.curves_png)  # fmt: skip
        except ValueError as err:
            return fail(CLUSTER, str(err))
    elif args.target_loss is not None:
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
        mode=args.mode,
        rounds=args.rounds,
        baseline=args.baseline,
        ranks_per_node=args.ranks_per_node,
        heldout=heldout,
        data_dir=args.data_dir,
        batch=args.batch,
        ring_gather_from=args.ring_gather_from,
        segment_from=args.segment_from,
    )


def add_cluster_parser(bench_sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p_cluster = bench_sub.add_parser(
        "cluster",
        help="DDP training steps on an emulated bandwidth-limited cluster (needs root)",
        description=(
            "Builds a cluster of network namespaces (one per node of --ranks-per-node ranks, "
            "veth pairs through a bridge "
            "namespace, tc tbf at the rate on both ends of every link), runs P gloo ranks with "
            "DDP and compares no communication, fp32 all-reduce, fp16_compress_hook, PowerSGD "
            "rank 1 and 4 and gradzip configurations, each in rank processes of its own (--mode "
            "isolated) or all in the same processes, their steps interleaved (--mode "
            "interleaved; both: the two side by side). Prints step ms, MB sent per node per "
            "step (measured on the node's veth), the speedup over fp32 and the ratio to "
            "--baseline; writes a PNG. Needs root and iproute2 (exit 2 otherwise); always removes its "
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
    p_cluster.add_argument(
        "--model",
        choices=("mlp-4096", "fc-300-100", *REAL_MODELS),
        default="mlp-4096",
        help="the model every variant trains: two MLPs (training loss), or ResNet-20 on "
        "Fashion-MNIST / CIFAR-10 and a character transformer on Python's docs text (held-out "
        "evaluation)",
    )
    p_cluster.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    p_cluster.add_argument(
        "--warmup", type=int, default=2, help="untimed steps first (>= 2: PowerSGD's start)"
    )
    p_cluster.add_argument(
        "--variants", nargs="+", metavar="NAME",
        help="only these variants (none fp32 fp16_hook powersgd_r1 ... gradzip:C[K=V,...][+ef]:SCHEME)",
    )  # fmt: skip
    p_cluster.add_argument(
        "--data",
        choices=("mnist", "synthetic", "fashion-mnist", "cifar10", "pydoc"),
        help="the training data: for the MLPs MNIST (default) or Gaussian inputs labelled by a "
        "random linear teacher; resnet20: fashion-mnist (default) or cifar10 (needs --data-dir); "
        "transformer-lm: pydoc (Python's reference text)",
    )
    p_cluster.add_argument(
        "--data-dir", metavar="DIR",
        help="where the data set's files are (CIFAR-10: the extracted cifar-10-batches-py)",
    )  # fmt: skip
    p_cluster.add_argument(
        "--batch", type=int, help="examples (windows) per rank per step (default: the model's)"
    )
    p_cluster.add_argument(
        "--threads", type=int, help="torch threads per rank (default: cores / P, at least 1)"
    )
    p_cluster.add_argument(
        "--timeout", type=float,
        help="seconds allowed to the ranks of one launch (and each collective); default "
        "1800 x max(1, P / 4)",
    )  # fmt: skip
    p_cluster.add_argument(
        "--ranks-per-node", type=int, default=1, metavar="K",
        help="ranks sharing one node's namespace (ranks [nK, (n+1)K) on node n): they talk over "
        "its loopback, unlimited; only the node's link is rate-limited (default 1)",
    )  # fmt: skip
    p_cluster.add_argument(
        "--ring-gather-from", type=int, metavar="BYTES",
        help="gradzip variants: all-gathers of slots of at least BYTES (0: all) take gloo's "
        "ring all-gather instead of an all-to-all to every peer (DistributedTransport's "
        "ring_gather_from; default: none do)",
    )  # fmt: skip
    p_cluster.add_argument(
        "--segment-from", type=int, metavar="BYTES",
        help="gradzip variants: all-to-alls (and all-gathers sent as one) of slots of at least "
        "BYTES go as 64 KiB messages to and from every peer, all posted at once, instead of "
        "one all_to_all_single (DistributedTransport's segment_from; default: none do)",
    )  # fmt: skip
    p_cluster.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p_cluster.add_argument(
        "--png", metavar="PATH", default="gradzip-cluster.png", help="the plot's path"
    )
    p_cluster.add_argument("--lr", type=float, help="SGD learning rate (default: the model's)")
    p_cluster.add_argument(
        "--mode", choices=("isolated", "interleaved", "both"), default="isolated",
        help="isolated: each variant in fresh rank processes of its own, one after another "
        "(default; how users run); interleaved: all in the same processes, steps alternating; "
        "both: the two, their ratios side by side",
    )  # fmt: skip
    p_cluster.add_argument(
        "--rounds", type=int, default=1,
        help="repeat the launches N times, the variant order rotated each round (default 1)",
    )  # fmt: skip
    p_cluster.add_argument(
        "--baseline", metavar="NAME",
        help="the variant the ratios are taken to (default: the first run other than none)",
    )  # fmt: skip
    p_cluster.add_argument(
        "--target-loss", type=float, metavar="L",
        help="time to a target loss: MLPs: each variant trains until the mean training loss of "
        "its last --window steps is at most L (or --steps run out); resnet20, transformer-lm: "
        "the held-out loss (nats per item / character); prints steps and seconds to it",
    )  # fmt: skip
    p_cluster.add_argument(
        "--target-accuracy", type=float, metavar="A",
        help="resnet20, transformer-lm: time to a held-out top-1 accuracy of A percent (0-100]",
    )  # fmt: skip
    p_cluster.add_argument(
        "--eval-every", type=int, default=None, metavar="N",
        help="resnet20, transformer-lm: evaluate the fixed held-out subset every N timed steps "
        f"and after the last (not timed; default {DEFAULT_EVAL_EVERY}); the MLPs have no "
        "held-out set and refuse it",
    )  # fmt: skip
    p_cluster.add_argument(
        "--seeds", type=int, default=1,
        help="resnet20, transformer-lm: repeat each variant with N seeds (model init and data "
        "order); the held-out table gives mean and sd (default 1)",
    )  # fmt: skip
    p_cluster.add_argument(
        "--window", type=int, default=10, help="steps in the target loss's mean (default 10)"
    )
    p_cluster.add_argument(
        "--curves-png", metavar="PATH", default="gradzip-cluster-curves.png",
        help="with --target-loss (MLPs) or for resnet20 / transformer-lm: loss, or held-out "
        "accuracy, against training time, a line per variant",
    )  # fmt: skip
    p_cluster.set_defaults(func=cmd_bench_cluster)
