"""``gradzip bench codecs``: encode/decode throughput and bits per coordinate of every compressor.

Every figure is measured in this run, on this machine, at each requested thread count (torch's
and numba's both set to it, in the one thread that runs every kernel; default one, 0 = every
core): GB/s are float32 input bytes (4 per coordinate) over the best of ``repeat`` timed runs;
bits per coordinate are measured payload sizes. The memcpy line is the yardstick (the best of
at least 20 copies into a preallocated buffer, at the same thread count). Decoding is timed
twice: into a fresh tensor (``decode``) and into a preallocated one (``decode_into_``, what the
all-gather's mean and the DDP hook use, and what memcpy is timed as); "round trip" is encode
plus the fresh decode, "round trip→buf" encode plus the decode into a buffer, each also as % of
memcpy. Given several thread counts, a last table gives one line per codec with its round trip
as % of memcpy at each. Each codec's first call on a small tensor is timed apart ("first
call": loading or compiling its numba kernels, once per process) so that it stays out of the
figures. Extra lines time the shared-randomness generator and the entropy coder (symbols/s),
which every dithered encode and every entropy-coded payload pay for.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from gradzip.compressors import get, names
from gradzip.keys import StreamKey
from gradzip.rng import shared_uniform
from gradzip_lab.bench.timing import best_time, memcpy_gbps

KEY = StreamKey(run_seed=2024, rank=0, step=1, tensor_index=0)
#: the fewest timed copies behind the memcpy yardstick: its best of 3 varied by 30% between
#: runs on a shared virtual machine, and a slow yardstick would flatter every codec
MEMCPY_REPEAT = 20


@dataclass
class CodecRow:
    """One compressor's figures."""

    name: str
    config: str
    encode_gbps: float
    decode_gbps: float
    round_trip_gbps: float
    round_trip_vs_memcpy: float
    decode_into_gbps: float
    round_trip_into_gbps: float
    round_trip_into_vs_memcpy: float
    wire_bits_per_coord: float
    paper_bits_per_coord: float


#: settings at which a codec compresses the benchmark's standard normal input, where its
#: ``example_params`` (chosen for tests) do not: threshold's tau = 1e-3 keeps every entry of
#: N(0, 1) (31.97 bits a coordinate); tau = 2 keeps the 4.6% beyond two standard deviations
BENCH_PARAMS: dict[str, dict[str, Any]] = {"threshold": {"tau": 2.0}}


def bench_params(name: str) -> dict[str, Any]:
    """The parameters ``name`` is benchmarked with."""
    return dict(BENCH_PARAMS.get(name, get(name).example_params))


def first_call_seconds(name: str) -> float:
    """Seconds of one encode and decode of 4096 values: numba's kernel loading or compiling,
    paid once per process (and compiling once per machine, thanks to numba's cache)."""
    comp = get(name)(**bench_params(name))
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    side = x if comp.needs_side_information else None
    start = time.perf_counter()
    comp.decode(comp.encode(x, KEY).payload, side=side)
    return time.perf_counter() - start


def bench_compressor(name: str, x: torch.Tensor, repeat: int, memcpy: float) -> CodecRow:
    comp = get(name)(**bench_params(name))
    side = x if comp.needs_side_information else None
    t_enc, enc = best_time(lambda: comp.encode(x, KEY), repeat)
    t_dec, _ = best_time(
        lambda: comp.decode(enc.payload, expected_key=KEY, shape=x.shape, side=side), repeat
    )
    buffer = torch.empty_like(x).fill_(0.0)  # touched once: no page faults while timed
    t_into, _ = best_time(
        lambda: comp.decode_into_(enc.payload, buffer, expected_key=KEY, side=side), repeat
    )
    nbytes = 4 * x.numel()
    round_trip = nbytes / (t_enc + t_dec) / 1e9
    round_trip_into = nbytes / (t_enc + t_into) / 1e9
    return CodecRow(
        name=name,
        config=comp.describe(),
        encode_gbps=nbytes / t_enc / 1e9,
        decode_gbps=nbytes / t_dec / 1e9,
        round_trip_gbps=round_trip,
        round_trip_vs_memcpy=round_trip / memcpy,
        decode_into_gbps=nbytes / t_into / 1e9,
        round_trip_into_gbps=round_trip_into,
        round_trip_into_vs_memcpy=round_trip_into / memcpy,
        wire_bits_per_coord=enc.wire_bits / x.numel(),
        paper_bits_per_coord=enc.paper_bits / x.numel(),
    )


def bench_shared_rng(numel: int, repeat: int) -> float:
    """GB/s of float32 shared uniforms generated."""
    seconds, _ = best_time(lambda: shared_uniform(KEY, numel), repeat)
    return 4 * numel / seconds / 1e9


def bench_entropy_coder(numel: int, repeat: int) -> dict[str, float]:
    """Symbols/s of the ANS coder on a ternary stream shaped like DQSG's (P(0) = 0.8)."""
    from gradzip.accounting import empirical_entropy_bits
    from gradzip.codecs.symbols import pack_symbols, unpack_symbols

    gen = torch.Generator().manual_seed(0)
    u = torch.rand(numel, generator=gen)
    symbols = torch.where(u < 0.1, 0, torch.where(u < 0.9, 1, 2)).to(torch.uint8)
    t_enc, packed = best_time(lambda: pack_symbols(symbols, 3, "entropy"), repeat)
    t_dec, _ = best_time(lambda: unpack_symbols(packed, numel, 3, "entropy"), repeat)
    entropy = empirical_entropy_bits(symbols)
    return {
        "encode_msym_per_s": numel / t_enc / 1e6,
        "decode_msym_per_s": numel / t_dec / 1e6,
        "coded_bits_over_entropy": 8 * packed.numel() / entropy if entropy else float("nan"),
    }


def resolve_threads(threads: int) -> int:
    """``threads`` clamped to numba's thread pool; 0 means every core numba may use."""
    import numba

    most = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    return most if threads == 0 else max(1, min(threads, most))


@contextmanager
def thread_count(threads: int) -> Iterator[None]:
    """Torch's and numba's thread counts set to ``threads`` meanwhile (numba's count is per
    calling thread: the one that runs every kernel here)."""
    import numba

    before = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(threads)
    numba.set_num_threads(threads)
    try:
        yield
    finally:
        # numba first: with its OpenMP layer, numba's setter may change the OpenMP thread
        # count torch reads (see kernels/_threads.py)
        numba.set_num_threads(before[1])
        torch.set_num_threads(before[0])


def _run_at(
    threads: int, numel: int, repeat: int, codecs: list[str], first_calls: dict[str, float]
) -> dict[str, Any]:
    """Every figure of one thread count (torch's and numba's both set to ``threads``): memcpy,
    the codecs, the dither generator and the entropy coder; prints them as a table."""
    import numba

    with thread_count(threads):
        memcpy = memcpy_gbps(numel, max(repeat, MEMCPY_REPEAT))
        print(
            f"gradzip bench codecs: {numel} float32 coordinates, {threads} thread(s) "
            f"(torch {torch.get_num_threads()}, numba {numba.get_num_threads()}), best of {repeat}"
        )
        print(f"memcpy (copy into preallocated buffer, {threads} thread(s)): {memcpy:.2f} GB/s")
        x = torch.randn(numel, generator=torch.Generator().manual_seed(1))
        rows = []
        header = (
            f"{'compressor':<12} {'encode GB/s':>11} {'decode GB/s':>11} {'round trip':>10} "
            f"{'% memcpy':>8} {'decode→buf':>10} {'round trip→buf':>14} {'% memcpy':>8} "
            f"{'wire b/coord':>12} {'paper b/coord':>13}  config"
        )
        print(header)
        for name in codecs:
            if name not in first_calls:
                first_calls[name] = first_call_seconds(name)
            row = bench_compressor(name, x, repeat, memcpy)
            rows.append(row)
            print(
                f"{row.name:<12} {row.encode_gbps:>11.3f} {row.decode_gbps:>11.3f} "
                f"{row.round_trip_gbps:>10.3f} {100 * row.round_trip_vs_memcpy:>7.1f}% "
                f"{row.decode_into_gbps:>10.3f} {row.round_trip_into_gbps:>14.3f} "
                f"{100 * row.round_trip_into_vs_memcpy:>7.1f}% "
                f"{row.wire_bits_per_coord:>12.4f} {row.paper_bits_per_coord:>13.4f}  {row.config}",
                flush=True,
            )
        rng = bench_shared_rng(numel, repeat)
        print(f"shared dither generator: {rng:.3f} GB/s of float32 uniforms")
        entropy = bench_entropy_coder(numel, repeat)
        print(
            f"entropy coder (ternary, P(0)=0.8): encode {entropy['encode_msym_per_s']:.1f} "
            f"M symbols/s, decode {entropy['decode_msym_per_s']:.1f} M symbols/s, "
            f"size {entropy['coded_bits_over_entropy']:.4f} x entropy"
        )
    return {
        "threads": threads,
        "memcpy_gbps": memcpy,
        "shared_rng_gbps": rng,
        "entropy_coder": entropy,
        "codecs": [asdict(r) for r in rows],
    }


def _sparse_at(threads: int, numel: int, repeat: int) -> list[dict[str, Any]]:
    """The sparse codings table at ``threads`` (torch's and numba's thread counts)."""
    from gradzip_lab.bench.sparse_codings import bench_sparse_codings

    with thread_count(threads):
        print(f"sparse codings ({numel} coordinates, {threads} thread(s), best of {repeat}):")
        x = torch.randn(numel, generator=torch.Generator().manual_seed(1))
        return [asdict(row) for row in bench_sparse_codings(x, repeat)]


def _print_summary(runs: list[dict[str, Any]]) -> None:
    """One line per codec: round trip as % of memcpy at each thread count of the run."""
    counts = [run["threads"] for run in runs]
    print("round trip (fresh output / into a buffer), % of memcpy at the same thread count:")
    print(f"{'compressor':<12} " + " ".join(f"{f'{n} thread(s)':>16}" for n in counts))
    for i, row in enumerate(runs[0]["codecs"]):
        shares = [
            f"{100 * run['codecs'][i]['round_trip_vs_memcpy']:.1f}% / "
            f"{100 * run['codecs'][i]['round_trip_into_vs_memcpy']:.1f}%"
            for run in runs
        ]
        print(f"{row['name']:<12} " + " ".join(f"{share:>16}" for share in shares))


def run(
    numel: int = 1 << 24,
    repeat: int = 3,
    only: list[str] | None = None,
    json_path: str | None = None,
    threads: int | Sequence[int] = 1,
) -> dict[str, Any]:
    """Run the benchmark at each thread count of ``threads`` (0: every core), print a table per
    count and, for several counts, one line per codec with its round trip as % of memcpy at
    each; where top-k or rand-k is among the codecs, a table of their index and value codings
    at the first thread count (:mod:`gradzip_lab.bench.sparse_codings`); optionally write JSON.
    Returns the figures: those of the first thread count at the top level, and under
    ``"runs"`` those of every count."""
    counts = [resolve_threads(n) for n in ([threads] if isinstance(threads, int) else threads)]
    codecs = list(only or names())
    first_calls: dict[str, float] = {}
    runs = [_run_at(n, numel, repeat, codecs, first_calls) for n in counts]
    print(
        "first call (numba kernel load or compile, not in the figures): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in first_calls.items())
    )
    if len(runs) > 1:
        _print_summary(runs)
    sparse: list[dict[str, Any]] = []
    if {"topk", "randk"} & set(codecs):
        sparse = _sparse_at(counts[0], numel, repeat)
    result: dict[str, Any] = {
        "numel": numel,
        "repeat": repeat,
        **runs[0],
        "first_call_seconds": first_calls,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "runs": runs,
        "sparse_codings": sparse,
    }
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
        print(f"wrote {json_path}")
    return result
