"""Compiling gradzip's numba kernels once, before use: ``python -m gradzip.warmup``.

numba compiles a kernel the first time it is called with a new combination of argument types,
then keeps the machine code in its on-disk cache (every gradzip kernel is ``cache=True``; see
:mod:`gradzip.kernels._numba_cache`). On a fresh install the first encode or decode of each
compressor, in each floating dtype, therefore waits for compilation: about a second a kernel,
minutes over the whole library on two cores. ``make test``, ``make test-fast`` and ``make
test-slow`` run this module first (again after a kernel module changes), so a fresh clone pays
that once instead of inside the test suite; a user can run it once after installing.

It calls, for every registered compressor (its ``example_params`` and the parameters in
:data:`WIDE_PARAMS` that change a kernel's argument types) and each of float32, float16,
bfloat16 and float64: ``encode``, ``decode`` and ``decode_add_`` of a tensor of several
4,096-value tiles and a partial one, of a small odd one and (float32) of a large one; then, on
two simulated ranks, one step of every reduction variant around every compressor it accepts,
without and with error feedback, tensor by tensor and as one batch. [CHOICE] This covers the
argument types the library's own paths use; a kernel first called with other types still
compiles, once, where it is first used. [CHOICE] Everything runs in this one process, one call after another: simplest, and
compiling is CPU-bound anyway. (Concurrent processes would be safe: :mod:`gradzip.kernels`
serialises numba's cache writes, see :mod:`gradzip.kernels._numba_cache_lock`.)
"""

from __future__ import annotations

import argparse
import time
from itertools import chain

import torch

#: the floating dtypes every compressor accepts
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: sizes: several 4,096-value tiles and a partial last one; a small odd tensor
SIZES = (3 * 4096 + 37, 7)
#: a float32 size past the kernels' size-dependent paths (sampled top-k thresholds, several
#: sign segments)
LARGE = (1 << 17) + 3
#: parameters beside ``example_params`` that change a kernel's argument types: wide symbols
#: (10-bit DQSG, nested DQSG's 300 cells), 24-bit LPC, entropy-coded (Golomb-Rice) QESGD, ...
WIDE_PARAMS: dict[str, tuple[dict[str, object], ...]] = {
    "dqsg": ({"M": 2}, {"M": 300}, {"M": 1, "bucket_size": None}),
    "half_dither": ({"M": 2},),
    "ndqsg": ({}, {"L1": 300, "k": 301, "bucket_size": 100}),
    "qsgd": ({"s": 2}, {"s": 7}, {"s": 16}, {"s": 127}),
    "hou": ({"b": 3, "scaled": True},),
    "lpc": ({"b": 4}, {"b": 24}),
    "qesgd": ({"delta": 1e-3, "bits": 16, "packing": "entropy"},),
}


def warm_compressor(name: str) -> str:
    """Encode, decode and decode-add with compressor ``name`` (its example parameters and the
    :data:`WIDE_PARAMS` ones) in every dtype and size."""
    from gradzip.compressors import get
    from gradzip.keys import StreamKey

    torch.set_num_threads(1)
    cls = get(name)
    key = StreamKey(run_seed=1, rank=0, step=0, tensor_index=0)
    gen = torch.Generator().manual_seed(0)
    for params in (cls.example_params, *WIDE_PARAMS.get(name, ())):
        comp = cls(**params)
        cases = [(dtype, n) for dtype in DTYPES for n in SIZES] + [(torch.float32, LARGE)]
        for dtype, n in cases:
            x = torch.randn(n, generator=gen).to(dtype)
            side = x + 0.01 if comp.needs_side_information else None
            payload = comp.encode(x, key).payload
            comp.decode(payload, expected_key=key, shape=x.shape, dtype=dtype, side=side)
            out = torch.zeros(n, dtype=dtype)
            comp.decode_add_(payload, out, expected_key=key, side=side)
    return name


def warm_scheme(variant: str) -> str:
    """One step of the reduction ``variant`` around every compressor it accepts, on two
    simulated ranks, without and (where the scheme takes it) with error feedback."""
    from gradzip.comm.local import run_local
    from gradzip.comm.transport import Transport
    from gradzip.compressors import get, names
    from gradzip.schemes import make_scheme, scheme_accepts

    torch.set_num_threads(1)

    def body(t: Transport) -> None:
        for name in names():
            cls = get(name)
            if not scheme_accepts(variant, cls(**cls.example_params)):
                continue
            for feedback in (False, True):
                compressor = cls(**cls.example_params)  # a scheme of its own each time
                try:
                    scheme = make_scheme(variant, compressor, run_seed=1, error_feedback=feedback)
                except ValueError:  # a scheme that keeps no residual refuses error feedback
                    continue
                gen = torch.Generator().manual_seed(t.rank)
                shapes = ((64, 48), (SIZES[0],), (5,))
                for index, shape in enumerate(shapes):
                    scheme.reduce(t, torch.randn(shape, generator=gen), 0, index)
                # and as one batch (a DDP bucket's): the integer all-reduce's batched kernels
                batch = [torch.randn(shape, generator=gen) for shape in shapes]
                scheme.reduce_many_if_all_finite(t, batch, (0, 1, 2), 1, True)

    run_local(2, body)
    return f"every compressor through {variant}"


def warm_all(show: bool = True) -> float:
    """Run every warm-up in this process; returns the seconds it took."""
    from gradzip.compressors import names
    from gradzip.schemes import VARIANTS

    start = time.perf_counter()
    for done in chain(map(warm_compressor, names()), map(warm_scheme, VARIANTS)):
        if show:
            print(f"  compiled: {done}", flush=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gradzip.warmup",
        description="Compile and cache gradzip's numba kernels now rather than at first use.",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the total")
    args = parser.parse_args(argv)
    seconds = warm_all(show=not args.quiet)
    print(f"gradzip's kernels are compiled and cached ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
