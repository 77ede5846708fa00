"""What one all-gather of equal slots costs on gloo in each of its two forms: the backend's
all-gather (a ring of ``P - 1`` rounds) and an all-to-all of this rank's slot to every rank
(one round; what :class:`gradzip.comm.distributed.DistributedTransport` runs on the CPU, see
its ``gather_as_all_to_all``). Both move the same bytes: ``P - 1`` slots out and in a rank.

Run: ``python benchmarks/gloo_gather_forms.py [--ranks 4] [--slots 256,57344] [--reps 300]
[--port 29588]``. Prints, for each slot size in bytes, rank 0's wall and CPU time (all its
threads, gloo's included) per collective, the forms alternating in blocks of ten so that a
change in the machine's load falls on both. The ranks share this machine's cores (on a 2-core
machine, 4 ranks are the P = 4 ResNet-20 runs of docs/performance.md), so the figures are of
this machine and its load; compare the forms, not the absolute times.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BLOCK = 10  # collectives of one form before the other's turn


def _time_forms(ranks: int, slot: int, reps: int) -> dict[str, tuple[float, float]]:
    """Seconds of wall and CPU time per collective of each form, for slots of ``slot`` bytes."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    mine = torch.zeros(slot, dtype=torch.uint8)
    replicated = mine.repeat(ranks)
    out = torch.empty(slot * ranks, dtype=torch.uint8)
    forms = {
        "all_gather": lambda: gather(out, mine),
        "all_to_all": lambda: dist.all_to_all_single(out, replicated),
    }
    totals = {name: [0.0, 0.0] for name in forms}
    for run in forms.values():  # warm-up: connections and buffers
        for _ in range(BLOCK):
            run()
    blocks = max(1, reps // BLOCK)
    for _ in range(blocks):
        for name, run in forms.items():
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(BLOCK):
                run()
            totals[name][0] += time.perf_counter() - wall
            totals[name][1] += time.process_time() - cpu
    count = blocks * BLOCK
    return {name: (wall_s / count, cpu_s / count) for name, (wall_s, cpu_s) in totals.items()}


def _rank(rank: int, ranks: int, port: int, slots: list[int], reps: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    for slot in slots:
        per_collective = _time_forms(ranks, slot, reps)
        if rank == 0:
            for name, (wall_s, cpu_s) in per_collective.items():
                print(
                    f"P={ranks} slot {slot:7d} B  {name:10s}  wall {wall_s * 1e3:6.2f} ms"
                    f"  cpu {cpu_s * 1e3:6.2f} ms per collective",
                    flush=True,
                )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--slots", default="256,57344", help="slot sizes in bytes")
    parser.add_argument("--reps", type=int, default=300, help="collectives of each form")
    parser.add_argument("--port", type=int, default=29588)
    args = parser.parse_args()
    slots = [int(s) for s in args.slots.split(",")]
    mp.spawn(_rank, args=(args.ranks, args.port, slots, args.reps), nprocs=args.ranks)


if __name__ == "__main__":
    main()
