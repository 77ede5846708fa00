"""Single-thread speed of the Philox4x32-10 stream kernels, in GB/s of float32 uniforms.

Usage: ``python benchmarks/philox_speed.py [--numel N] [--tile T] [--repeats R]``

Times :func:`gradzip.kernels.philox.fill_stream` (the serial generator every fused codec calls
per tile) on one thread: over an L1/L2-sized tile reused many times (the codecs' pattern) and
over one large array (memory-bound store). Prints the median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit

from gradzip.kernels.philox import LOCAL_UNIFORM, fill_stream


@njit(nogil=True)
def _tiles(k0, k1, out, tile, rounds):  # type: ignore[no-untyped-def]
    for r in range(rounds):
        for lo in range(0, out.size, tile):
            hi = min(out.size, lo + tile)
            fill_stream(k0, k1, LOCAL_UNIFORM, r * out.size + lo, out[lo:hi], 9, 0x3F800000)


def _median_gbps(fn, nbytes: int, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return nbytes / float(np.median(times)) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=1 << 22)
    parser.add_argument("--tile", type=int, default=1 << 13)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    k0, k1 = 0x12345678, 0x9ABCDEF0
    tile = np.empty(args.tile, dtype=np.uint32)
    rounds = max(1, args.numel // args.tile)
    big = np.empty(args.numel, dtype=np.uint32)
    in_cache = _median_gbps(
        lambda: _tiles(k0, k1, tile, args.tile, rounds), 4 * args.tile * rounds, args.repeats
    )
    streamed = _median_gbps(
        lambda: fill_stream(k0, k1, LOCAL_UNIFORM, 3, big, 9, 0x3F800000),
        4 * args.numel,
        args.repeats,
    )
    print(
        f"fill_stream, 1 thread: {in_cache:.1f} GB/s into a {args.tile}-element tile, "
        f"{streamed:.1f} GB/s into a {args.numel}-element array"
    )


if __name__ == "__main__":
    main()
