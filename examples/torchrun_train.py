"""Train a small classifier on P processes, averaging compressed gradients with gradzip.

Launch it with torchrun, which starts the processes and sets the env:// variables (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)::

    torchrun --standalone --nproc_per_node=4 examples/torchrun_train.py \\
        --compressor dqsg --error-feedback --steps 50

The data are synthetic: a fixed seed generates one data set (Gaussian inputs, labels from a
random linear "teacher"), and each rank trains on its own shard of it, so nothing is
downloaded and every run is reproducible. Each step every rank compresses its gradients, the
ranks exchange the payloads through a ``DistributedTransport`` and all apply the same average.
Rank 0 prints the loss (averaged over the ranks) each step, and at the end the bytes each rank
sent and received per step and a checksum of the parameters, which every rank computes and
which must agree across ranks.

Gloo on the CPU by default; ``--device cuda`` uses NCCL with one GPU per process.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import os
import struct
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import gradzip
from gradzip.comm.distributed import DistributedTransport
from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError
from gradzip.optim import CompressedOptimizer
from gradzip.schemes import SCHEMES, make_scheme
from gradzip.sync import GradientSync

FEATURES, HIDDEN, CLASSES = 20, 32, 4


def has_ddp_hook() -> bool:
    """Whether this version of gradzip has the DDP communication hook."""
    try:
        return importlib.util.find_spec("gradzip.integrations.ddp") is not None
    except ImportError:
        return False


def key_values(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE a Python literal (a number, True, None, ...) or else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compressor", default="dqsg", choices=gradzip.names())
    parser.add_argument(
        "--param",
        type=key_values,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a compressor parameter (repeatable); without any, the compressor's defaults, or "
        "its example parameters if it has no defaults",
    )
    parser.add_argument("--scheme", default="allgather", choices=sorted(SCHEMES))
    parser.add_argument(
        "--scheme-param",
        type=key_values,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the scheme (repeatable), e.g. downlink=fp32",
    )
    parser.add_argument("--error-feedback", action="store_true")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--run-seed", type=int, default=0, help="keys the shared randomness")
    parser.add_argument("--data-seed", type=int, default=1234, help="data and initial weights")
    parser.add_argument("--samples", type=int, default=4096, help="size of the whole data set")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank and step")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a rank waits for a peer before it raises (dead or stalled peer)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    if has_ddp_hook():
        parser.add_argument(
            "--ddp",
            action="store_true",
            help="wrap the model in DistributedDataParallel with gradzip's communication hook",
        )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.timeout <= 0:
        parser.error("--steps and --batch-size must be positive, and so must --timeout")
    args.ddp = getattr(args, "ddp", False)
    return args


def make_compressor(args: argparse.Namespace) -> tuple[gradzip.Compressor, dict[str, Any]]:
    params = dict(args.param)
    if params:
        return gradzip.create(args.compressor, **params), params
    try:
        return gradzip.create(args.compressor), params
    except (TypeError, ValueError):  # a required parameter: use the documented example
        params = dict(gradzip.get(args.compressor).example_params)
        return gradzip.create(args.compressor, **params), params


def data_shard(
    args: argparse.Namespace, rank: int, world_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard (every ``world_size``-th sample) of the fixed-seed data set."""
    gen = torch.Generator().manual_seed(args.data_seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)
    x = torch.randn(args.samples, FEATURES, generator=gen)
    y = (x @ teacher + 0.5 * torch.randn(args.samples, CLASSES, generator=gen)).argmax(dim=1)
    return x[rank::world_size], y[rank::world_size]


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    """The same initial weights on every rank (from the data seed)."""
    torch.manual_seed(args.data_seed)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES)
    )


def checksum(model: torch.nn.Module) -> bytes:
    """SHA-256 of every parameter's bytes, in order."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.digest()


def report(transport: Transport, model: torch.nn.Module, steps: int) -> bool:
    """Rank 0 prints each rank's traffic per step and whether the parameters agree."""
    traffic = transport.meter.total()  # before the report's own messages
    mine = struct.pack("<qqq", traffic.sent, traffic.received, traffic.messages)
    with transport.step_scope(None):  # the report's messages belong to no training step
        everyone = [struct.unpack("<qqq", b) for b in transport.all_gather_bytes(mine)]
        digests = transport.all_gather_bytes(checksum(model))
    agree = len(set(digests)) == 1
    if transport.rank == 0:
        print(f"traffic per step over {steps} steps (payloads + 8-byte length prefixes):")
        for rank, (sent, received, messages) in enumerate(everyone):
            print(
                f"  rank {rank}: sent {sent / steps:,.1f} B, received {received / steps:,.1f} B, "
                f"{messages / steps:.1f} messages"
            )
        verdict = (
            "all ranks agree"
            if agree
            else "RANKS DISAGREE: " + ", ".join(d.hex()[:16] for d in digests)
        )
        print(f"parameter checksum {digests[0].hex()[:16]}: {verdict}")
    return agree


def train(args: argparse.Namespace) -> int:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else None
    transport = DistributedTransport(timeout=args.timeout)
    compressor, params = make_compressor(args)
    try:
        scheme = make_scheme(
            args.scheme,
            compressor,
            run_seed=args.run_seed,
            error_feedback=args.error_feedback,
            **dict(args.scheme_param),
        )
    except (TypeError, ValueError) as err:
        if rank == 0:
            print(f"error: {err}", file=sys.stderr)
        return 2
    model = make_model(args).to(device or "cpu")
    x_all, y_all = data_shard(args, rank, world_size)
    if device is not None:
        x_all, y_all = x_all.to(device), y_all.to(device)
    if rank == 0:
        print(
            f"{world_size} ranks, backend {transport.backend}, compressor {args.compressor} "
            f"{params or '(defaults)'}, scheme {args.scheme}, error feedback {args.error_feedback}, "
            f"{'DDP hook' if args.ddp else 'CompressedOptimizer'}, timeout {args.timeout} s"
        )

    sgd = torch.optim.SGD(model.parameters(), lr=args.lr)
    net: torch.nn.Module = model
    optimizer: torch.optim.Optimizer | CompressedOptimizer
    hook_state = None
    if args.ddp:
        from gradzip.integrations.ddp import register_gradzip_hook

        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=None if device is None else [device.index]
        )
        hook_state = register_gradzip_hook(ddp, scheme, transport=transport)
        net, optimizer = ddp, sgd
    else:
        optimizer = CompressedOptimizer(sgd, GradientSync(transport, scheme=scheme))

    for step in range(args.steps):
        start = (step * args.batch_size) % len(x_all)
        x = x_all[start : start + args.batch_size]
        y = y_all[start : start + args.batch_size]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        torch.autograd.backward(loss)
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # for the printout only, outside the transport's meter
        if rank == 0:
            print(f"step {step:4d}  loss {float(mean_loss) / world_size:.4f}", flush=True)
    if hook_state is not None:
        hook_state.close()  # its threads end here, before the process group goes
    return 0 if report(transport, model, args.steps) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("error: --device cuda but CUDA is not available", file=sys.stderr)
            return 2
        local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(local)
        # device_id: the group's communicator carries the point-to-point traffic too
        dist.init_process_group("nccl", timeout=timedelta(seconds=args.timeout), device_id=local)
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    try:
        return train(args)
    except GradzipError as err:
        print(f"gradzip error: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
