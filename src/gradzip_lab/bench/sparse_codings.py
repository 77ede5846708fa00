"""The sparse codings table of ``gradzip bench codecs``: top-k and rand-k at small ratios with
each index and value coding (:mod:`gradzip.compressors._sparse_coding`), measured on the
benchmark's input: wire bits per kept value and per coordinate (from the payload sizes, headers
included), and encode and decode throughput in GB/s of float32 input."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from gradzip.compressors import create
from gradzip.compressors.topk import kept_count
from gradzip.keys import StreamKey
from gradzip_lab.bench.timing import best_time

KEY = StreamKey(run_seed=2024, rank=0, step=1, tensor_index=0)
#: (compressor, ratio, coding parameters), in the order printed
CONFIGS: list[tuple[str, float, dict[str, Any]]] = [
    *(
        ("topk", ratio, coding)
        for ratio in (0.001, 0.01)
        for coding in (
            {},
            {"index_coding": "rice"},
            {"index_coding": "rice", "value_codec": "fp16"},
            {"index_coding": "rice", "value_codec": "qsgd"},
            {"index_coding": "rice", "value_codec": "dqsg"},
        )
    ),
    ("randk", 0.01, {}),
    ("randk", 0.01, {"value_codec": "fp16"}),
    ("randk", 0.01, {"value_codec": "qsgd"}),
]


@dataclass
class SparseRow:
    """One sparse configuration's figures."""

    config: str
    kept: int
    wire_bits_per_kept: float
    wire_bits_per_coord: float
    encode_gbps: float
    decode_gbps: float


def bench_sparse_codings(x: torch.Tensor, repeat: int) -> list[SparseRow]:
    """Measure every configuration of :data:`CONFIGS` on ``x`` and print one line each."""
    print(
        f"{'sparse coding':<76} {'kept':>9} {'wire b/kept':>11} {'wire b/coord':>12} "
        f"{'encode GB/s':>11} {'decode GB/s':>11}"
    )
    rows = []
    nbytes = 4 * x.numel()
    for name, ratio, coding in CONFIGS:
        comp = create(name, ratio=ratio, **coding)
        t_enc, enc = best_time(partial(comp.encode, x, KEY), repeat)
        t_dec, _ = best_time(
            partial(comp.decode, enc.payload, expected_key=KEY, shape=x.shape), repeat
        )
        kept = kept_count(0, ratio, x.numel())
        row = SparseRow(
            config=comp.describe(),
            kept=kept,
            wire_bits_per_kept=enc.wire_bits / kept,
            wire_bits_per_coord=enc.wire_bits / x.numel(),
            encode_gbps=nbytes / t_enc / 1e9,
            decode_gbps=nbytes / t_dec / 1e9,
        )
        rows.append(row)
        print(
            f"{row.config:<76} {row.kept:>9} {row.wire_bits_per_kept:>11.2f} "
            f"{row.wire_bits_per_coord:>12.4f} {row.encode_gbps:>11.3f} {row.decode_gbps:>11.3f}",
            flush=True,
        )
    return rows
