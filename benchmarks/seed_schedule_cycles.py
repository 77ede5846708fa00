"""Cycles and reused dither seeds of the two seed schedules (spec 0.4).

Run: ``.venv/bin/python benchmarks/seed_schedule_cycles.py [--workers 4] [--iterations 1500]
[--draws 266610] [--run-seed 0]``. ``--draws`` is the number of dither uniforms the authors draw
per iteration: 266,610 is FC-300-100 (784-300-100-10, weights and biases).

For ``"chain"`` it prints the cycle each worker's chain falls into (its length and the
iteration the chain enters it) and, for both schedules, the share of messages (worker,
iteration) over ``--iterations`` whose dither seed is also used by another message of the run.
"""

from __future__ import annotations

import argparse
from collections import Counter

from gradzip.keys import StreamKey
from gradzip.seed_schedule import ChainSeeds, SeedSchedule


def cycle_of(chains: ChainSeeds, run_seed: int, rank: int) -> tuple[int, int]:
    """``(entry iteration, cycle length)`` of worker ``rank``'s chain."""
    first_seen: dict[int, int] = {}
    step = 0
    while True:
        seed = chains.seed(run_seed, rank, step)
        if seed in first_seen:
            return first_seen[seed], step - first_seen[seed]
        first_seen[seed] = step
        step += 1


def reused_share(schedule: SeedSchedule, run_seed: int, workers: int, iterations: int) -> float:
    """The share of messages whose seed (tensor 0) is used by another message of the run."""
    seeds = [
        schedule.shared_seed(StreamKey(run_seed, rank, step, 0))
        for rank in range(workers)
        for step in range(iterations)
    ]
    counts = Counter(seeds)
    return sum(counts[s] > 1 for s in seeds) / len(seeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=1500)
    parser.add_argument("--draws", type=int, default=266610)
    parser.add_argument("--run-seed", type=int, default=0)
    args = parser.parse_args()

    chain = SeedSchedule("chain", chain_draws=args.draws)
    chains = chain.chain_seeds  # one walk: the cycles below and the reuse share read the same
    assert chains is not None
    print(f"chain schedule, {args.draws} draws per iteration, run seed {args.run_seed}")
    cycles = set()
    for rank in range(args.workers):
        entry, length = cycle_of(chains, args.run_seed, rank)
        cycle = frozenset(chains.seed(args.run_seed, rank, entry + i) for i in range(length))
        cycles.add(cycle)
        print(f"  worker {rank}: enters a cycle of length {length} at iteration {entry}")
    print(f"  distinct cycles among the workers: {len(cycles)}")
    for name, schedule in (("keyed", SeedSchedule("keyed")), ("chain", chain)):
        share = reused_share(schedule, args.run_seed, args.workers, args.iterations)
        print(
            f"{name:>5}: {share:.1%} of {args.workers} x {args.iterations} messages reuse a "
            "dither seed used elsewhere in the run"
        )


if __name__ == "__main__":
    main()
