"""CPU cost per coordinate of the all-gather DDP hook with one-bit error feedback, 2 ranks.

Usage: ``python benchmarks/onebit_hook_speed.py [--threads T] [--repeats R] [--numel N]``

Splits ``N`` float32 gradients (default 36.8M, the wide MLP's) into 25 MB flat buckets, as DDP
hands them to the hook, and times per bucket what one rank's CPU does in
``AllGatherDecode(create("onebit"), error_feedback=True)``: the fused feedback encode
(``encode_flagged``: ``v = g + e``, the packing pass, ``e = v - v_hat``) and the averaging
(``average``: decode its own payload, ``decode_add_`` the peer's, divide). The second rank's
encode is run but not counted. Prints the sum over buckets of each bucket's best time.
"""

from __future__ import annotations

import argparse
import time

import numba
import torch

from gradzip.compressors.registry import create
from gradzip.schemes.allgather_decode import AllGatherDecode

BUCKET_BYTES = 25 * 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--numel", type=int, default=36_800_000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    bucket = BUCKET_BYTES // 4
    sizes = [bucket] * (args.numel // bucket) + (
        [args.numel % bucket] if args.numel % bucket else []
    )
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(n, generator=gen) * 1e-3 for n in sizes]
    ranks = [AllGatherDecode(create("onebit"), error_feedback=True) for _ in range(2)]
    encode = [float("inf")] * len(sizes)
    average = [float("inf")] * len(sizes)
    for step in range(args.repeats + 1):  # step 0 warms up (and creates the residuals)
        for i, g in enumerate(grads):
            start = time.perf_counter()
            own = ranks[0].encode_flagged(0, g, step, i)
            mid = time.perf_counter()
            peer = ranks[1].encode_flagged(1, g, step, i)
            before = time.perf_counter()
            ranks[0].average([own.payload, peer.payload], step, i, g.shape, own.dtype)
            end = time.perf_counter()
            if step:
                encode[i] = min(encode[i], mid - start)
                average[i] = min(average[i], end - before)
    n = args.numel
    enc, avg = sum(encode), sum(average)
    print(
        f"threads={args.threads} buckets={len(sizes)} coordinates={n}: "
        f"encode with feedback {enc * 1e3:.1f} ms ({enc / n * 1e9:.2f} ns/coord), "
        f"decode + decode_add_ + divide {avg * 1e3:.1f} ms ({avg / n * 1e9:.2f} ns/coord), "
        f"hook {(enc + avg) / n * 1e9:.2f} ns/coord"
    )


if __name__ == "__main__":
    main()
