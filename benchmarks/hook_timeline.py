"""Where a DDP training step's time goes with gradzip's hook, on an emulated bandwidth-limited
cluster: forward, backward, and when each stage (encode, transfer, decode) worked on each chunk.

Run as root: ``python benchmarks/hook_timeline.py [--rate 100mbit] [--world-size 2]
[--compressor qsgd] [--param M=2] [--scheme allgather] [--error-feedback] [--steps 5]``.

It builds the same cluster as ``gradzip bench cluster`` (a namespace per rank, veth pairs
through a bridge namespace, tbf at ``--rate`` on both ends of every link; always torn down),
runs the ranks with DDP on the 36.8M-parameter MLP (``mlp-4096``, random batches of 32) and
gradzip's hook with ``record_timeline=True``, and prints rank 0's last step: the end of the
forward pass, of ``backward()`` and of the optimizer step, and every stage span in ms from the
step's start, ordered by start. The wire is idle where no transfer span covers the time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import timedelta


def rank_main(config: dict) -> None:  # type: ignore[type-arg]
    import os

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.parallel import DistributedDataParallel

    import gradzip
    from gradzip.comm.distributed import DistributedTransport
    from gradzip.integrations.ddp import register_gradzip_hook
    from gradzip.models.paper import build_model
    from gradzip.schemes import make_scheme

    rank, size = config["rank"], config["world_size"]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    os.environ["GLOO_SOCKET_IFNAME"] = "veth0"
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{config['master']}:29531",
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=600),
    )
    ddp = DistributedDataParallel(build_model("dryden-mlp", 13), gradient_as_bucket_view=True)
    compressor = gradzip.create(config["compressor"], **config["params"])
    scheme = make_scheme(config["scheme"], compressor, run_seed=1, error_feedback=config["ef"])
    state = register_gradzip_hook(
        ddp, scheme, transport=DistributedTransport(timeout=600), record_timeline=True
    )
    assert state.timeline is not None
    opt = torch.optim.SGD(ddp.parameters(), lr=0.03)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, 1, 28, 28, generator=gen), torch.randint(0, 10, (32,), generator=gen)
    for _ in range(config["steps"]):
        dist.barrier()
        state.timeline.clear()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        out = ddp(x)
        t_forward = time.perf_counter()
        torch.autograd.backward(F.cross_entropy(out, y))
        t_backward = time.perf_counter()
        opt.step()
        t_step = time.perf_counter()
    state.close()
    if rank == 0:
        ms = lambda t: round(1e3 * (t - t0), 1)  # noqa: E731
        print(f"forward ends {ms(t_forward)} ms, backward {ms(t_backward)}, step {ms(t_step)}")
        print(f"{'stage':<9} {'bucket':>6} {'chunk':>5} {'start ms':>9} {'end ms':>9}")
        for s in sorted(state.timeline.spans, key=lambda s: s.start):
            chunk = "-" if s.chunk is None else s.chunk
            print(f"{s.stage:<9} {s.bucket:>6} {chunk:>5} {ms(s.start):>9} {ms(s.end):>9}")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="100mbit", help="tbf rate, or none")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--compressor", default="qsgd")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--scheme", default="allgather")
    parser.add_argument("--error-feedback", action="store_true")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    from gradzip.cli.params import compressor_params
    from gradzip_lab.bench.cluster_netns import ClusterNetwork, missing_privilege

    problem = missing_privilege()
    if problem:
        print(f"hook_timeline: {problem}", file=sys.stderr)
        return 2
    net = ClusterNetwork(args.world_size, run=31)
    net.setup()
    try:
        net.set_rate(args.rate)
        procs = []
        for rank in range(args.world_size):
            config = {
                "rank": rank,
                "world_size": args.world_size,
                "master": net.address(0),
                "compressor": args.compressor,
                "params": compressor_params(args.compressor, args.param),
                "scheme": args.scheme,
                "ef": args.error_feedback,
                "steps": args.steps,
            }
            argv = [sys.executable, __file__, "--rank-config", json.dumps(config)]
            procs.append(subprocess.Popen([*net.exec_prefix(rank), *argv]))
        return max(p.wait() for p in procs)
    finally:
        net.teardown()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank-config":
        rank_main(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
