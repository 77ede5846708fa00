"""The fused stochastic-rounding kernels against their torch-operations twin (the device path):
same bytes, same decoded values, whatever the shape, bucket size, level count, scale range or
thread count."""

from __future__ import annotations

import numba
import pytest
import torch

from gradzip.codecs.bitpack import pack_bits
from gradzip.compressors import get
from gradzip.errors import CorruptPayloadError
from gradzip.kernels.backend import forced_torch_ops as torch_ops_only
from gradzip.kernels.bitpack_torch import pack_bits_torch, unpack_bits_torch
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, parse_payload

KEY = StreamKey(run_seed=7, rank=1, step=3, tensor_index=2)


def _inputs(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    zeros = x.clone()
    zeros[: min(n, 600)] = 0.0  # a zero bucket (or a zero prefix)
    return {
        "normal": x,
        "zero_bucket": zeros,
        "tiny": x * 1e-39,  # subnormal scales: 1/step overflows float32 (float64 buckets)
        "smallest": x.sign() * 2.0**-149,
        "huge": x * 1e37,
        "mixed": torch.cat((x[: n // 2] * 1e-40, x[n // 2 :])),
    }


CASES = [
    ("qsgd", {"s": 1}),
    ("qsgd", {"s": 1, "bucket_size": 100}),
    ("qsgd", {"s": 3, "bucket_size": 37}),
    ("qsgd", {"s": 7, "bucket_size": None}),
    ("qsgd", {"s": 127, "bucket_size": 64}),
    ("qsgd", {"s": 200, "bucket_size": 512}),  # int32 symbols, float64 arithmetic
    ("qsgd", {"s": 2, "bucket_size": 20000}),  # buckets larger than a tile
    ("qsgd", {"s": 2, "norm": "l2"}),
    ("terngrad", {}),
    ("terngrad", {"bucket_size": None}),
    ("hou", {}),
    ("hou", {"b": 11}),
    ("lpc", {}),
    ("lpc", {"b": 3, "theta": 0.4}),  # clipping
    ("lpc", {"b": 18, "theta": 0.7}),
    ("qesgd", {"delta": 0.05, "bits": 3}),
    ("qesgd", {"delta": 1e-3, "bits": 12}),
    ("qsgd_l2", {"bits": 5, "bucket_size": 300}),
    ("qsgd_l2", {"bits": 10, "bucket_size": None}),
]


@pytest.mark.parametrize(("name", "params"), CASES)
@pytest.mark.parametrize("n", [1, 13, 4096, 9001])
def test_fused_kernel_equals_torch_twin(name: str, params: dict, n: int) -> None:
    comp = get(name)(**params)
    for label, x in _inputs(n, n).items():
        enc = comp.encode(x, KEY)
        out = comp.decode(enc.payload)
        with torch_ops_only():
            enc_t = comp.encode(x, KEY)
            out_t = comp.decode(enc.payload)
        assert enc.payload == enc_t.payload, (name, params, n, label)
        assert torch.equal(out.view(torch.int32), out_t.view(torch.int32)), (name, n, label)
        assert torch.equal(enc.streams[0].to(torch.int64), enc_t.streams[0].to(torch.int64))


def test_clipping_projects_onto_the_grid() -> None:
    x = torch.linspace(-1.0, 1.0, 1001)
    comp = get("lpc")(b=3, theta=0.25)  # s = 3, hull +-0.25
    out = comp.decode(comp.encode(x, KEY).payload)
    assert float(out.abs().max()) == pytest.approx(0.25, rel=1e-6)
    assert torch.equal(out[x > 0.3], torch.full_like(out[x > 0.3], float(out.max())))


def test_thread_count_does_not_change_the_bytes() -> None:
    x = torch.randn(70001, generator=torch.Generator().manual_seed(3))
    comp = get("qsgd")(s=3, bucket_size=96)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = comp.encode(x, KEY).payload
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = comp.encode(x, KEY).payload
    finally:
        numba.set_num_threads(before)
    assert one == many


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 8, 11, 16, 24])
def test_torch_packing_matches_the_codec(bits: int) -> None:
    g = torch.Generator().manual_seed(bits)
    for n in (1, 7, 8, 1001):
        symbols = torch.randint(0, 2**bits, (n,), generator=g)
        packed = pack_bits_torch(symbols, bits)
        assert torch.equal(packed, pack_bits(symbols, bits))
        assert torch.equal(unpack_bits_torch(packed, n, bits), symbols)


def test_symbol_outside_the_alphabet_is_rejected() -> None:
    comp = get("terngrad")(bucket_size=None)
    header, raw = parse_payload(comp.encode(torch.randn(64), KEY).payload)
    # symbol 3 (0b11) is outside the ternary alphabet {0, 1, 2}
    bad = build_payload(header, [bytes(raw[:4]), b"\xff" * (len(raw) - 4)])
    with pytest.raises(CorruptPayloadError):
        comp.decode(bad)
    with torch_ops_only(), pytest.raises(CorruptPayloadError):
        comp.decode(bad)
