"""Speed and size of the "dense" and "entropy" symbol packings on 2**24 quantizer-like symbols.

Run: ``.venv/bin/python benchmarks/entropy_speed.py [--n 16777216] [--repeats 5]``.
Single-threaded (``torch.set_num_threads(1)``); reports the best of ``--repeats`` runs in
million symbols per second, and the packed size relative to the empirical entropy ``n*H``.
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from gradzip.codecs.entropy import entropy_decode, entropy_encode
from gradzip.codecs.radix import pack_radix, unpack_radix

DISTRIBUTIONS = {
    "L=3 P(0)=0.9": [0.05, 0.9, 0.05],
    "L=3 uniform": [1 / 3] * 3,
    "L=3 P(0)=0.999": [0.0005, 0.999, 0.0005],
    "L=5 peaked": [0.02, 0.1, 0.76, 0.1, 0.02],
    "L=5 uniform": [0.2] * 5,
    "L=9 peaked": [0.001, 0.01, 0.05, 0.2, 0.478, 0.2, 0.05, 0.01, 0.001],
}


def _best(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    best, result = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


Codec = tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


def _codecs(symbols: torch.Tensor, L: int) -> dict[str, Codec]:
    n = symbols.numel()
    return {
        "entropy": (lambda: entropy_encode(symbols, L), lambda d: entropy_decode(d, n, L)),
        "dense": (lambda: pack_radix(symbols, L), lambda d: unpack_radix(d, n, L)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1 << 24)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.n
    print(f"n = {n}, best of {args.repeats}, 1 thread")
    print(f"{'stream':16} {'codec':8} {'enc Msym/s':>10} {'dec Msym/s':>10} {'bytes/(nH/8)':>13}")
    for name, probs in DISTRIBUTIONS.items():
        L = len(probs)
        values = np.random.default_rng(0).choice(L, size=n, p=probs).astype(np.uint8)
        symbols = torch.from_numpy(values)
        counts = np.bincount(values, minlength=L)
        p = counts[counts > 0] / n
        nh_bytes = float(-(p * np.log2(p)).sum()) * n / 8
        codecs = _codecs(symbols, L)
        for codec, (encode, decode) in codecs.items():
            t_enc, data = _best(encode, args.repeats)
            assert isinstance(data, torch.Tensor)
            t_dec, out = _best(functools.partial(decode, data), args.repeats)
            assert isinstance(out, torch.Tensor) and torch.equal(out, symbols)
            print(
                f"{name:16} {codec:8} {n / t_enc / 1e6:10.0f} {n / t_dec / 1e6:10.0f} "
                f"{data.numel() / nh_bytes:13.4f}"
            )


if __name__ == "__main__":
    main()
