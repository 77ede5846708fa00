"""Single-thread speed of the Philox4x32-10 stream kernels: float32 uniforms and raw words.

Usage: ``python benchmarks/philox_speed.py [--numel N] [--tile T] [--repeats R]``

Times :func:`gradzip.kernels.philox.fill_uniform` (the serial float generator every fused codec
calls per tile, two uniforms per Philox word) and :func:`gradzip.kernels.philox.fill_words`
(raw 32-bit words, for random indices) on one thread: over an L1/L2-sized tile reused many
times (the codecs' pattern) and over one large array (memory-bound store). Prints the median of
``--repeats`` runs in G elements per second (and GB/s of the 4-byte elements).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
from numba import njit

from gradzip.kernels.philox import LOCAL_UNIFORM, fill_uniform, fill_words


@njit(nogil=True)
def _uniform_tiles(k0, k1, out, tile, rounds):  # type: ignore[no-untyped-def]
    for r in range(rounds):
        for lo in range(0, out.size, tile):
            hi = min(out.size, lo + tile)
            fill_uniform(k0, k1, LOCAL_UNIFORM, r * out.size + lo, out[lo:hi])


@njit(nogil=True)
def _word_tiles(k0, k1, out, tile, rounds):  # type: ignore[no-untyped-def]
    for r in range(rounds):
        for lo in range(0, out.size, tile):
            hi = min(out.size, lo + tile)
            fill_words(k0, k1, LOCAL_UNIFORM, r * out.size + lo, out[lo:hi])


def _median_rate(fn: Callable[[], object], count: int, repeats: int) -> float:
    """Elements per second of ``fn`` (which makes ``count`` elements), median of ``repeats``."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return count / float(np.median(times))


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
    for name, tiles, fill in (
        ("fill_uniform (float32 1 + u)", _uniform_tiles, fill_uniform),
        ("fill_words (uint32 words)", _word_tiles, fill_words),
    ):
        in_cache = _median_rate(
            lambda t=tiles: t(k0, k1, tile, args.tile, rounds), args.tile * rounds, args.repeats
        )
        streamed = _median_rate(
            lambda f=fill: f(k0, k1, LOCAL_UNIFORM, 3, big), args.numel, args.repeats
        )
        print(
            f"{name}, 1 thread: {in_cache / 1e9:.2f} G/s ({4 * in_cache / 1e9:.1f} GB/s) into a "
            f"{args.tile}-element tile, {streamed / 1e9:.2f} G/s ({4 * streamed / 1e9:.1f} GB/s) "
            f"into a {args.numel}-element array; 2**24 elements in {2**24 / in_cache * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()
