"""One step of the ring-byte schemes on P simulated ranks (threads over LocalTransport): the
step time of the slowest rank after a warm-up step, the bytes each rank sent (the transport's
meter), and the time those bytes take on a link of ``--gbits`` Gbit/s.

Run: ``python benchmarks/ring_allreduce_step.py [--numel 36.8e6] [--ranks 4] [--codec dqsg]
[--schemes ring_allreduce ring allreduce]``.

The ranks share this machine's cores (P threads), so a step measures the codec work of all P
ranks on those cores, an upper bound on one rank's on a core of its own; the link time is what
the measured bytes would take at the given rate. The codec keeps up with the link when the step
is below the link time.
"""

from __future__ import annotations

import argparse
import time

import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.schemes import make_scheme


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=float, default=36.8e6)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--codec", default="dqsg")
    parser.add_argument("--gbits", type=float, default=1.0)
    parser.add_argument("--schemes", nargs="+", default=["ring_allreduce", "ring", "allreduce"])
    args = parser.parse_args()
    n = int(args.numel)
    codec = gradzip.create(args.codec)
    print(
        f"{args.codec} {codec.describe()}, n = {n}, P = {args.ranks}, {torch.get_num_threads()} torch threads"
    )
    for spec in args.schemes:

        def run(t: Transport, spec: str = spec) -> tuple[float, int]:
            scheme = make_scheme(spec, codec, run_seed=0)
            g = torch.randn(n, generator=torch.Generator().manual_seed(t.rank))
            scheme.reduce(t, g, 0, 0)  # warm-up: kernels compiled or loaded, buffers made
            start = time.perf_counter()
            scheme.reduce(t, g, 1, 0)
            return time.perf_counter() - start, t.meter.total(step=1).sent

        results = run_local(args.ranks, run, timeout=900)
        step = max(r[0] for r in results)
        sent = max(r[1] for r in results)
        link = sent * 8 / (args.gbits * 1e9)
        print(
            f"{spec:>16}: step {step:6.2f} s  sent/rank {sent / 1e6:7.2f} MB  "
            f"link at {args.gbits:g} Gbit/s {link:5.2f} s"
        )


if __name__ == "__main__":
    main()
