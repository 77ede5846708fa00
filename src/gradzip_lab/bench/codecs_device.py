"""``gradzip bench codecs --device cuda``: encode/decode throughput of the codecs on a device.

Every figure is measured in this run on the device: the input is the CPU benchmark's standard
normal tensor (same seed) moved to the device, each codec runs with its registry
``example_params``, and GB/s are float32 input bytes (4 per coordinate) over the best of
``repeat`` timed runs, the device synchronized before and after each (CUDA kernels return
before they finish). The yardstick is the device's own ``clone()`` of the same tensor (best of
at least 20): a round trip (encode plus decode into a fresh tensor) is printed as a ratio to it.

The payload's home is printed per codec: host bytes (``bytes``), or a ``uint8`` tensor on the
device once the codec's encode is GPU-resident. Sizes are ``len(payload)``, which both have.
The table is the same code on any device: ``--device cpu`` is not routed here (the CPU table of
:mod:`gradzip_lab.bench.codecs` stays as it is), but the tests run this module on the CPU.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from gradzip.compressors import get
from gradzip_lab.bench.codecs import KEY, MEMCPY_REPEAT, bench_params, resolve_threads, thread_count
from gradzip_lab.bench.devices import device_name
from gradzip_lab.bench.timing import best_device_time

#: the codecs benchmarked on a device (registry names), the dense quantizers first
DEVICE_CODECS = (
    "dqsg", "ndqsg", "half_dither", "qsgd", "terngrad", "hou", "lpc", "qesgd", "onebit",
    "fp16", "bf16", "identity", "topk", "randk",
)  # fmt: skip


@dataclass
class DeviceCodecRow:
    """One codec's figures on the device."""

    name: str
    config: str
    encode_gbps: float
    decode_gbps: float
    round_trip_gbps: float
    round_trip_vs_clone: float
    payload_bits_per_coord: float
    payload_on: str  # "host" (bytes) or the device type of a tensor payload


def clone_gbps(x: torch.Tensor, repeat: int) -> float:
    """GB/s of ``x.clone()`` on ``x``'s device (source bytes): the device's memory yardstick."""
    seconds, _ = best_device_time(x.clone, max(repeat, MEMCPY_REPEAT), x.device)
    return 4 * x.numel() / seconds / 1e9


def _decode_options(payload: object, device: torch.device) -> dict[str, Any]:
    """How to ask for a decode on ``device``: host bytes name it (``device=``); a payload that
    is a tensor already lives there, and decodes where it lives."""
    return {} if isinstance(payload, torch.Tensor) else {"device": device}


def bench_on_device(name: str, x: torch.Tensor, repeat: int, clone: float) -> DeviceCodecRow:
    """Encode, decode and round-trip figures of codec ``name`` on ``x`` (on its device)."""
    comp = get(name)(**bench_params(name))
    side = x if comp.needs_side_information else None
    t_enc, enc = best_device_time(lambda: comp.encode(x, KEY), repeat, x.device)
    payload = enc.payload
    options = _decode_options(payload, x.device)
    t_dec, out = best_device_time(
        lambda: comp.decode(payload, expected_key=KEY, shape=x.shape, side=side, **options),
        repeat,
        x.device,
    )
    if out.device != x.device:
        raise RuntimeError(f"{name}: decoded onto {out.device}, asked for {x.device}")
    nbytes = 4 * x.numel()
    round_trip = nbytes / (t_enc + t_dec) / 1e9
    return DeviceCodecRow(
        name=name,
        config=comp.describe(),
        encode_gbps=nbytes / t_enc / 1e9,
        decode_gbps=nbytes / t_dec / 1e9,
        round_trip_gbps=round_trip,
        round_trip_vs_clone=round_trip / clone,
        payload_bits_per_coord=8 * len(payload) / x.numel(),
        payload_on=payload.device.type if isinstance(payload, torch.Tensor) else "host",
    )


def run(
    device: torch.device,
    numel: int = 1 << 24,
    repeat: int = 3,
    only: Sequence[str] | None = None,
    json_path: str | None = None,
    threads: int = 1,
) -> dict[str, Any]:
    """Benchmark the codecs (``only``, else :data:`DEVICE_CODECS`) on ``device``; print the
    clone yardstick and one line per codec; optionally write JSON. Returns the figures.

    ``threads`` (0: every core) is torch's and numba's thread count meanwhile, as on the CPU
    table: whatever part of a codec still runs on the host runs on that many threads."""
    threads = resolve_threads(threads)
    with thread_count(threads):
        return _run(device, numel, repeat, list(only or DEVICE_CODECS), json_path, threads)


def _run(
    device: torch.device,
    numel: int,
    repeat: int,
    codecs: list[str],
    json_path: str | None,
    threads: int,
) -> dict[str, Any]:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(1)).to(device)
    clone = clone_gbps(x, repeat)
    print(
        f"gradzip bench codecs on {device_name(device)}: {numel} float32 coordinates, best of "
        f"{repeat}, the device synchronized around every timed run, {threads} host thread(s)"
    )
    print(f"clone() on the device: {clone:.2f} GB/s")
    print(
        f"{'compressor':<12} {'encode GB/s':>11} {'decode GB/s':>11} {'round trip':>10} "
        f"{'rt / clone':>10} {'payload b/coord':>15} {'payload on':>10}  config"
    )
    rows = []
    for name in codecs:
        row = bench_on_device(name, x, repeat, clone)
        rows.append(row)
        print(
            f"{row.name:<12} {row.encode_gbps:>11.3f} {row.decode_gbps:>11.3f} "
            f"{row.round_trip_gbps:>10.3f} {row.round_trip_vs_clone:>10.4f} "
            f"{row.payload_bits_per_coord:>15.4f} {row.payload_on:>10}  {row.config}",
            flush=True,
        )
    result: dict[str, Any] = {
        "device": device_name(device),
        "numel": numel,
        "repeat": repeat,
        "threads": threads,
        "clone_gbps": clone,
        "codecs": [asdict(r) for r in rows],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "machine": platform.machine(),
    }
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
        print(f"wrote {json_path}")
    return result
