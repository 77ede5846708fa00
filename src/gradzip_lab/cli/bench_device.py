"""``gradzip bench hook`` and ``gradzip bench sim-ranks``: the one-device benchmark and check.

Both take ``--device cpu|cuda``; ``cuda`` without a CUDA device exits 2 with a line naming the
problem, before anything runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from gradzip.cli.help import fail

HOOK = "gradzip bench hook"
SIM_RANKS = "gradzip bench sim-ranks"


def add_device_parsers(bench_sub: Any) -> None:
    """Register ``hook`` and ``sim-ranks`` on ``gradzip bench``'s subparsers."""
    p_hook = bench_sub.add_parser(
        "hook",
        help="DDP step time of each communication hook on one device (one rank)",
        description=(
            "One process, torch.distributed with world size 1 (NCCL on CUDA, gloo on the CPU): "
            "the model of gradzip bench cluster, DDP-wrapped, trains under each variant in turn "
            "(fp32 = no hook, torch's fp16_compress_hook and powerSGD_hook rank 1, gradzip's "
            "hooks). Prints the median ms per step (forward, backward with the hook, optimizer "
            "step; after the warm-up) and its ratio to fp16_hook and to powersgd_r1."
        ),
    )
    _add_device(p_hook)
    p_hook.add_argument(
        "--model", choices=("mlp-4096", "fc-300-100"), default="mlp-4096",
        help="the model (mlp-4096: 36.8M parameters; fc-300-100: 0.27M, for a CPU)",
    )  # fmt: skip
    p_hook.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    p_hook.add_argument(
        "--warmup", type=int, default=3, help="untimed steps first (>= 2: PowerSGD's start)"
    )
    p_hook.add_argument("--batch", type=int, default=32, help="examples per step")
    p_hook.add_argument(
        "--variants", nargs="+", metavar="NAME",
        help="these variants instead (names of gradzip bench cluster: fp32 fp16_hook "
        "powersgd_r1 ... gradzip:C[K=V,...][+ef]:SCHEME)",
    )  # fmt: skip
    p_hook.add_argument(
        "--threads", type=int, metavar="N",
        help="torch threads (default: torch's own; 1 on a small CPU, where its spinning pool "
        "slows gloo's all-reduce)",
    )  # fmt: skip
    p_hook.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    p_hook.set_defaults(func=cmd_bench_hook)
    p_sim = bench_sub.add_parser(
        "sim-ranks",
        help="simulated ranks with device tensors give the CPU's means bit for bit",
        description=(
            "P simulated ranks (threads over the in-process transport) run GradientSync for a "
            "few steps with dqsg and qsgd all-gathers, onebit with error feedback and PowerSGD "
            "with fp16 factors, once with the gradients on --device and once on the CPU; exit "
            "1 unless every rank's every mean is equal bit for bit (trivially so on the CPU)."
        ),
    )
    _add_device(p_sim)
    p_sim.add_argument("--world-size", type=int, default=4, help="simulated ranks")
    p_sim.add_argument("--steps", type=int, default=3, help="steps per exchange")
    p_sim.set_defaults(func=cmd_bench_sim_ranks)


def _add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the tensors live"
    )


def cmd_bench_hook(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.warmup < 2 or args.batch < 1 or (args.threads or 1) < 1:
        return fail(HOOK, "--steps, --batch and --threads must be >= 1, --warmup >= 2")
    from gradzip_lab.bench import devices  # imports torch: after the options are checked

    problem = devices.missing_device(args.device)
    if problem:
        return fail(HOOK, problem)
    from gradzip_lab.bench.hook import run

    try:
        run(
            devices.resolve(args.device),
            model=args.model,
            steps=args.steps,
            warmup=args.warmup,
            batch=args.batch,
            variants=args.variants,
            json_path=args.json,
            threads=args.threads,
        )
    except ValueError as err:  # an unknown variant name
        return fail(HOOK, str(err))
    return 0


def cmd_bench_sim_ranks(args: argparse.Namespace) -> int:
    if args.world_size < 1 or args.steps < 1:
        return fail(SIM_RANKS, "--world-size and --steps must be >= 1")
    from gradzip_lab.bench import devices  # imports torch: after the options are checked

    problem = devices.missing_device(args.device)
    if problem:
        return fail(SIM_RANKS, problem)
    from gradzip_lab.bench.sim_ranks import check

    device = devices.resolve(args.device)
    print(
        f"{SIM_RANKS}: {args.world_size} simulated ranks, {args.steps} steps, tensors on "
        f"{devices.device_name(device)} against the CPU"
    )
    results = check(device, world_size=args.world_size, steps=args.steps)
    for result in results:
        verdict = "equal" if result.equal else f"DIFFERENT ({result.detail})"
        print(f"  {result.spec:<32} {verdict}")
    if not all(r.equal for r in results):
        return fail(SIM_RANKS, "the device's means differ from the CPU's", status=1)
    return 0
