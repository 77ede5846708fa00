"""Whether a link of the emulated cluster carries a transfer both ways at once at its rate: gloo's
send and receive of one large message each way, against the same bytes one way, the same bytes
both ways cut into 64 KiB messages all posted at once, and a plain TCP socket carrying one
transfer each way (two threads on one connection).

Run as root: ``python benchmarks/gloo_duplex.py [--rate 100mbit] [--mib 1,4,12] [--reps 3]``.
It builds a two-node cluster as ``gradzip bench cluster`` does (network namespaces, veth, tbf on
both ends of each link; deleted at the end), starts one process a node and prints, for each size,
the rate of every repetition in MB/s a direction. On the development VM gloo moved a large
message both ways at once at half the link's rate in most repetitions and at the full rate
in others, while one way, the 64 KiB messages both ways, and a plain socket both ways ran at
the rate: a limit of gloo's one large message, not of the emulated link (docs/performance.md,
the scaling model's last miss). The ranks share the machine's cores; the figures are of this
machine.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

GLOO_PORT = 29613
SOCKET_PORT = 29614
#: the messages the segmented form cuts each transfer into, all posted at once
SEGMENT_BYTES = 64 << 10


def _gloo_rates(rank: int, address: str, sizes: list[int], reps: int) -> list[str]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "veth0"
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{address}:{GLOO_PORT}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=300),
    )
    peer = 1 - rank
    lines = []
    for size in sizes:
        out, into = torch.zeros(size, dtype=torch.uint8), torch.empty(size, dtype=torch.uint8)
        one_way, both_ways, segmented = [], [], []
        for _ in range(reps):
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(out, peer)
            else:
                dist.recv(into, peer)
            dist.barrier()  # the receiver's end counts: both ranks time to the same point
            one_way.append(size / (time.perf_counter() - start) / 1e6)
            start = time.perf_counter()
            for request in (dist.isend(out, peer), dist.irecv(into, peer)):
                request.wait()
            dist.barrier()
            both_ways.append(size / (time.perf_counter() - start) / 1e6)
            start = time.perf_counter()
            requests = []
            for tag, offset in enumerate(range(0, size, SEGMENT_BYTES)):
                end = min(size, offset + SEGMENT_BYTES)
                requests.append(dist.isend(out[offset:end], peer, tag=tag))
                requests.append(dist.irecv(into[offset:end], peer, tag=tag))
            for request in requests:
                request.wait()
            dist.barrier()
            segmented.append(size / (time.perf_counter() - start) / 1e6)
        lines.append(
            f"gloo {size >> 20:3d} MiB: one way {_rates(one_way)}; both ways {_rates(both_ways)}; "
            f"both ways in {SEGMENT_BYTES >> 10} KiB messages {_rates(segmented)}"
        )
    dist.destroy_process_group()
    return lines


def _socket_rates(rank: int, address: str, sizes: list[int], reps: int) -> list[str]:
    if rank == 0:
        with socket.create_server((address, SOCKET_PORT)) as server:
            conn, _ = server.accept()
    else:
        conn = _connect(address)
    lines = []
    for size in sizes:
        data = bytes(size)

        def receive(count: int = size) -> None:
            got = 0
            while got < count:  # never past this transfer: the handshake's byte follows it
                got += len(conn.recv(min(1 << 20, count - got)))

        both_ways = []
        for _ in range(reps):
            _handshake(conn, rank)
            start = time.perf_counter()
            threads = [
                threading.Thread(target=conn.sendall, args=(data,)),
                threading.Thread(target=receive),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            _handshake(conn, rank)
            both_ways.append(size / (time.perf_counter() - start) / 1e6)
        lines.append(f"TCP  {size >> 20:3d} MiB: both ways {_rates(both_ways)}")
    conn.close()
    return lines


def _connect(address: str) -> socket.socket:
    for _ in range(100):  # the server may not listen yet
        try:
            return socket.create_connection((address, SOCKET_PORT))
        except ConnectionRefusedError:
            time.sleep(0.1)
    raise RuntimeError(f"no server at {address}:{SOCKET_PORT}")


def _handshake(conn: socket.socket, rank: int) -> None:
    """One byte each way: both ends start (and stop) a timing together."""
    if rank == 0:
        conn.sendall(b"x")
        conn.recv(1)
    else:
        conn.recv(1)
        conn.sendall(b"x")


def _rates(values: list[float]) -> str:
    return " ".join(f"{v:6.1f}" for v in values) + " MB/s"


def _rank_main(rank: int, address: str, sizes: list[int], reps: int) -> None:
    lines = _gloo_rates(rank, address, sizes, reps) + _socket_rates(rank, address, sizes, reps)
    if rank == 0:
        print("\n".join(lines), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="100mbit", help="the links' tc rate (default 100mbit)")
    parser.add_argument("--mib", default="1,4,12", help="message sizes in MiB (default 1,4,12)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each (default 3)")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(float(text) * (1 << 20)) for text in args.mib.split(",")]
    if args.rank is not None:
        _rank_main(args.rank, args.address, sizes, args.reps)
        return 0
    from gradzip_lab.bench.cluster_launch import built_cluster, signals_raise
    from gradzip_lab.bench.cluster_netns import missing_privilege

    problem = missing_privilege()
    if problem:
        print(f"gloo_duplex.py {problem}", file=sys.stderr)
        return 2
    with signals_raise(), built_cluster(2) as net:  # a signal still deletes the namespaces
        net.set_rate(args.rate)
        address = net.address(0)
        print(f"two nodes, links at {args.rate} (tbf on both ends), {args.reps} repetitions:")
        procs = [
            subprocess.Popen(
                [
                    *net.exec_prefix(rank),
                    sys.executable,
                    __file__,
                    "--rank",
                    str(rank),
                    "--address",
                    address,
                    "--mib",
                    args.mib,
                    "--reps",
                    str(args.reps),
                ]
            )
            for rank in range(2)
        ]
        codes = [proc.wait() for proc in procs]
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    raise SystemExit(main())
