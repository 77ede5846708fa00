"""Hostile payloads of at most 64 KiB: genuine payloads whose header declares another size.

A receiver decoding without ``shape=`` (as the README does) trusts nothing but the payload, so
a payload whose header is rewritten to declare 2**28 elements, with its CRC recomputed, must be
decoded or refused at a cost bounded by its size (see
:mod:`gradzip.compressors._decode_guards`). This module builds such payloads for every
registered compressor and for the coding options that change how a body is read (entropy
packing, Elias and Golomb-Rice codes, sparse value codecs). The contract test
(``tests/compressors/test_decode_bounds.py``) asserts refusal before any allocation;
``benchmarks/hostile_decode.py`` measures the time and memory of each decode.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from gradzip.compressors import Compressor, get, names
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, parse_payload

KEY = StreamKey(run_seed=5, rank=1, step=3, tensor_index=2)
#: the largest payload the target covers: decoded or refused in 0.1 s and 64 MiB
MAX_PAYLOAD_BYTES = 1 << 16

#: coding options beyond each compressor's ``example_params`` (every registered compressor is
#: covered with its ``example_params`` even when it is missing here)
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("identity", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("dqsg", {"M": 1}),
    ("dqsg", {"M": 2, "packing": "dense"}),
    ("dqsg", {"M": 2, "packing": "entropy"}),
    ("half_dither", {"M": 1, "dither_sum": 2}),
    ("half_dither", {"M": 1, "dither_sum": 2, "packing": "entropy"}),
    ("ndqsg", {"L1": 3, "k": 3, "alpha": 1.0}),
    ("ndqsg", {"L1": 3, "k": 3, "alpha": 1.0, "packing": "entropy"}),
    ("qsgd", {"s": 1}),
    ("qsgd", {"s": 4, "packing": "entropy"}),
    ("qsgd", {"s": 4, "coding": "elias", "norm": "l2"}),
    ("terngrad", {}),
    ("terngrad", {"packing": "entropy"}),
    ("hou", {}),
    ("hou", {"packing": "entropy"}),
    ("lpc", {}),
    ("lpc", {"packing": "entropy"}),
    ("qesgd", {"delta": 1e-3}),
    ("qesgd", {"delta": 1e-3, "packing": "entropy"}),
    ("qesgd", {"delta": 1e-3, "bits": 16, "packing": "entropy"}),
    ("qsgd_l2", {"bits": 8}),
    ("qsgd_l2", {"bits": 8, "packing": "entropy"}),
    ("onebit", {}),
    ("onebit", {"packing": "entropy"}),
    ("threshold", {"tau": 1e-3}),
    ("threshold", {"tau": 1.0, "coding": "golomb_rice"}),
    ("adaptive", {"proportion": 32}),
    ("adaptive", {"proportion": 32, "coding": "golomb_rice"}),
    ("topk", {"ratio": 0.1}),
    ("topk", {"k": 1000, "index_coding": "rice", "value_codec": "fp16"}),
    ("topk", {"k": 1000, "value_codec": "qsgd", "value_levels": 4}),
    ("randk", {"ratio": 0.1}),
    ("randk", {"k": 1000, "value_codec": "dqsg"}),
]


def variants() -> list[tuple[str, dict[str, Any]]]:
    """:data:`VARIANTS` plus every registered compressor it misses, with its example
    parameters (so a new compressor is covered without editing this list)."""
    listed = {name for name, _ in VARIANTS}
    extra = [(name, dict(get(name).example_params)) for name in names() if name not in listed]
    return VARIANTS + extra


def label(name: str, params: dict[str, Any]) -> str:
    """``name(k=v, ...)`` for reports and test ids."""
    return f"{name}({', '.join(f'{k}={v}' for k, v in params.items())})"


def declaring(payload: bytes | memoryview, shape: tuple[int, ...]) -> bytes:
    """``payload`` with its header's shape replaced by ``shape`` and its CRC recomputed."""
    header, body = parse_payload(payload)
    return build_payload(dataclasses.replace(header, shape=shape), [bytes(body)])


def gradient(numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A gradient-like tensor of shape ``(numel // 64, 64)``: every grouping codec sees rows."""
    x = torch.randn(numel // 64, 64, generator=torch.Generator().manual_seed(numel))
    return x.to(dtype)


@dataclass(frozen=True)
class Genuine:
    """A real payload and what decoding it needs: ``side`` for nested codecs."""

    payload: bytes
    numel: int
    side: torch.Tensor | None


def genuine(comp: Compressor, dtype: torch.dtype = torch.float32) -> list[Genuine]:
    """Real payloads of ``comp`` up to :data:`MAX_PAYLOAD_BYTES`: of 1024 elements and of the
    largest gradient of ``1024 * 4**j`` elements (up to 2**20) whose payload still fits.

    Where even 1024 signed values do not fit (an entropy-coded 16-bit two's complement stream
    sends a count for each of its 65536 codes), the gradient's absolute values are used."""
    for sign in (False, True):
        found: list[Genuine] = []
        numel = 1 << 10
        while numel <= 1 << 20:
            x = gradient(numel, dtype)
            x = x.abs() if sign else x
            payload = bytes(comp.encode(x, KEY).payload)
            if len(payload) > MAX_PAYLOAD_BYTES:
                break
            side = x.to(torch.float32).reshape(-1) if comp.needs_side_information else None
            found.append(Genuine(payload, numel, side))
            numel *= 4
        if found:
            return found[:1] + found[-1:] if len(found) > 1 else found
    raise ValueError(f"{comp.describe()}: no payload of 1024 values fits in {MAX_PAYLOAD_BYTES}")


#: element counts a hostile header declares (the largest is the most one payload may hold)
DECLARED = (1 << 20, 1 << 24, 1 << 26, 1 << 28, 1 << 31)


def shapes(numel: int) -> list[tuple[int, ...]]:
    """The 1-D shape of ``numel`` elements and two 2-D ones (few long rows, many short rows),
    since grouping codecs (onebit, adaptive, lpc) derive their group count from the shape."""
    return [(numel,), (64, numel // 64), (numel // 64, 64)]
