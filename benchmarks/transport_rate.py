"""Line rate and latency of gradzip's transport against raw gloo, over an emulated link.

Run as root: ``python benchmarks/transport_rate.py [--rate 100mbit] [--repeats 3]``.

It creates two network namespaces of its own (names with a prefix holding this process's id),
joins them by a veth pair with the addresses ``10.214.<x>.1`` and ``10.214.<x>.2`` (inside those
namespaces only), limits both ends with ``tc qdisc ... root tbf rate <rate> burst 32kbit
latency 400ms``, runs two gloo ranks in them (one per namespace, ``ip netns exec``) and prints:

* rate (Mbit/s, payload bytes one rank sends divided by the time, median of ``--repeats``) of raw
  ``dist.all_reduce`` of 16 MiB float32 (a ring sends ``2 (P-1)/P`` of it per rank), raw
  ``dist.all_gather`` of 4 MiB, raw point-to-point exchanges of 4 MiB (isend then recv, and
  irecv posted first), gradzip's ``all_gather_bytes`` and ``exchange_bytes`` of 4 MiB;
* with the limit removed, the latency (median of many round trips) of a 100-byte
  ``exchange_bytes`` and ``all_gather_bytes`` against a one-float ``dist.all_reduce``.

The namespaces are always torn down (``finally``). The gradzip measured is whichever one is
importable, so ``PYTHONPATH=<another checkout>/src`` measures another version's transport.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

MiB = 1 << 20


def sh(*args: str) -> None:
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


class Link:
    """Two namespaces joined by a veth pair; ``limit(rate)`` shapes both ends."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.prefix = f"gztr{pid}"
        self.ns = (f"{self.prefix}a", f"{self.prefix}b")
        self.dev = (f"{self.prefix}x", f"{self.prefix}y")
        third = pid % 250 + 1
        self.addr = (f"10.214.{third}.1", f"10.214.{third}.2")
        self.made: list[str] = []

    def __enter__(self) -> Link:
        try:
            for ns in self.ns:
                sh("ip", "netns", "add", ns)
                self.made.append(ns)
            sh("ip", "link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
            for ns, dev, addr in zip(self.ns, self.dev, self.addr, strict=True):
                sh("ip", "link", "set", dev, "netns", ns)
                sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                sh("ip", "-n", ns, "link", "set", dev, "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def limit(self, rate: str | None) -> None:
        for ns, dev in zip(self.ns, self.dev, strict=True):
            subprocess.run(
                ["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if rate is not None:
                sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                   "burst", "32kbit", "latency", "400ms")  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        for ns in self.made:  # deleting a namespace deletes the veth end inside it
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        self.made.clear()


def run_ranks(link: Link, phase: str, repeats: int, port: int) -> dict[str, float]:
    procs = []
    for rank in range(2):
        env = dict(os.environ, GLOO_SOCKET_IFNAME=link.dev[rank])
        cmd = ["ip", "netns", "exec", link.ns[rank], sys.executable, __file__, "--worker",
               phase, str(rank), link.addr[0], str(port), str(repeats)]  # fmt: skip
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=900) for p in procs]
    if any(p.returncode for p in procs):
        for rank, (_, err) in enumerate(outs):
            print(f"rank {rank} stderr:\n{err}", file=sys.stderr)
        codes = [p.returncode for p in procs]
        raise SystemExit(f"a rank failed in phase {phase}: exit codes {codes}")
    return dict(json.loads(outs[0][0].strip().splitlines()[-1]))


# -- inside a rank -------------------------------------------------------------------------------
def worker(phase: str, rank: int, addr: str, port: int, repeats: int) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from gradzip.comm.distributed import DistributedTransport

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=120),
    )  # fmt: skip
    transport = DistributedTransport(timeout=120.0)
    peer = 1 - rank
    out: dict[str, float] = {}

    def timed(fn: Callable[[], object], reps: int) -> float:
        fn()  # warm-up (connections, buffers)
        times = []
        for _ in range(reps):
            dist.barrier()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def rate(sent_bytes: int, seconds: float) -> float:
        return sent_bytes * 8 / seconds / 1e6

    if phase == "rate":
        big = torch.ones(16 * MiB // 4)
        out["raw all_reduce 16 MiB"] = rate(16 * MiB, timed(lambda: dist.all_reduce(big), repeats))
        four = torch.full((4 * MiB,), rank, dtype=torch.uint8)
        into = [torch.empty_like(four) for _ in range(2)]
        out["raw all_gather 4 MiB"] = rate(
            4 * MiB, timed(lambda: dist.all_gather(into, four), repeats)
        )
        got = torch.empty_like(four)

        def isend_then_recv() -> None:
            work = dist.isend(four, peer)
            dist.recv(got, peer)
            work.wait()

        def irecv_first() -> None:
            incoming = dist.irecv(got, peer)
            outgoing = dist.isend(four, peer)
            incoming.wait()
            outgoing.wait()

        out["raw isend then recv 4 MiB"] = rate(4 * MiB, timed(isend_then_recv, repeats))
        out["raw irecv posted first 4 MiB"] = rate(4 * MiB, timed(irecv_first, repeats))
        payload = bytes(four.numpy())
        out["gradzip all_gather_bytes 4 MiB"] = rate(
            4 * MiB, timed(lambda: transport.all_gather_bytes(payload), repeats)
        )
        out["gradzip exchange_bytes 4 MiB"] = rate(
            4 * MiB, timed(lambda: transport.exchange_bytes(peer, payload, peer, "x"), repeats)
        )
        # one direction, timed on rank 0, the receiver (a sender's time ends when its socket
        # buffer takes the data)
        out["gradzip broadcast_bytes 4 MiB (to 0)"] = rate(
            4 * MiB, timed(lambda: transport.broadcast_bytes(payload, 1), repeats)
        )
        out["gradzip gather_bytes 4 MiB (at 0)"] = rate(
            4 * MiB, timed(lambda: transport.gather_bytes(payload, 0), repeats)
        )
    else:
        one = torch.ones(1)
        small = bytes(100)
        reps = 20 * repeats + 100
        ms = 1e3
        out["raw all_reduce 1 float (ms)"] = ms * timed(lambda: dist.all_reduce(one), reps)
        out["gradzip exchange_bytes 100 B (ms)"] = ms * timed(
            lambda: transport.exchange_bytes(peer, small, peer, "x"), reps
        )
        out["gradzip all_gather_bytes 100 B (ms)"] = ms * timed(
            lambda: transport.all_gather_bytes(small), reps
        )
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="100mbit", help="tbf rate of both ends (tc syntax)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per rate figure")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        phase, rank, addr, port, repeats = args.worker
        worker(phase, int(rank), addr, int(port), int(repeats))
        return
    if os.geteuid() != 0:
        print("transport_rate needs root (network namespaces and tc)", file=sys.stderr)
        raise SystemExit(2)
    with Link() as link:
        link.limit(args.rate)
        rates = run_ranks(link, "rate", args.repeats, 29411)
        link.limit(None)
        latency = run_ranks(link, "latency", args.repeats, 29412)
    print(f"link: veth, tbf {args.rate} on both ends; rates are payload Mbit/s sent per rank")
    for name, value in rates.items():
        print(f"  {name:<36} {value:8.1f} Mbit/s")
    print("no limit: median latency of one operation")
    for name, value in latency.items():
        print(f"  {name:<36} {value:8.3f}")


if __name__ == "__main__":
    main()
