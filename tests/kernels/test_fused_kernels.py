"""The fused numba kernels of the dithered quantizers against their torch-operations twin (the
device path, forced on CPU tensors): payload bytes, symbols and decoded values identical."""

from __future__ import annotations

import pytest
import torch

from gradzip.codecs.bitpack import pack_bits
from gradzip.compressors import create
from gradzip.compressors.base import Compressor
from gradzip.errors import CorruptPayloadError
from gradzip.kernels.backend import forced_torch_ops
from gradzip.kernels.bitpack_torch import pack_bits_torch, unpack_bits_torch
from gradzip.kernels.dithered import DITHER_SPAN, tile_elements
from gradzip.keys import StreamKey

KEY = StreamKey(run_seed=3, rank=1, step=9, tensor_index=4)

CODECS = [
    ("dqsg", {"M": 1}),
    ("dqsg", {"M": 2}),
    ("dqsg", {"M": 127}),
    ("dqsg", {"M": 128}),  # float64 index arithmetic
    ("dqsg", {"M": 40000}),  # 17-bit symbols
    ("ndqsg", {"L1": 3, "k": 3}),
    ("ndqsg", {"L1": 1, "k": 5, "alpha": 0.7}),
    ("ndqsg", {"L1": 300, "k": 3, "alpha": 0.5}),  # top > 255: float64
    ("ndqsg", {"L1": 2, "k": 301}),  # 9-bit symbols
    ("half_dither", {"M": 1, "dither_sum": 1}),
    ("half_dither", {"M": 3, "dither_sum": 2}),
    ("half_dither", {"M": 2, "dither_sum": 3}),  # float64 sum of three uniforms
    ("half_dither", {"M": 200, "dither_sum": 1}),  # 9-bit symbols
]


def inputs(n: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen)
    out = {"normal": x, "zeros": torch.zeros(n)}
    if n > 700:
        mixed = x * 3
        mixed[100:612] = 0.0  # zero buckets
        mixed[612:650] = 1e-40  # subnormal scale: M/sigma overflows float32
        mixed[650:700] *= 1e37  # huge scale
        out["mixed"] = mixed
    tiny = x * 1e-44
    out["tiny"] = tiny
    return out


def assert_fused_equals_torch(
    comp: Compressor, x: torch.Tensor, y: torch.Tensor, where: object
) -> None:
    """The fused kernels and the torch operations give the same payload, symbol stream and
    decoded bits for ``x`` (``y``: the side information, for the codecs that take one)."""
    side = y if comp.needs_side_information else None
    fused = comp.encode(x, KEY)
    fused_out = comp.decode(fused.payload, side=side)
    with forced_torch_ops():
        ref = comp.encode(x, KEY)
        ref_out = comp.decode(fused.payload, side=side)
    assert fused.payload == ref.payload, where
    assert torch.equal(fused.streams[0].long(), ref.streams[0].long()), where
    assert torch.equal(fused_out, ref_out), where
    assert fused_out.view(torch.int32).equal(ref_out.view(torch.int32)), where


@pytest.mark.parametrize(("name", "params"), CODECS)
@pytest.mark.parametrize("bucket_size", [None, 7, 100])
def test_fused_kernels_equal_torch_operations(
    name: str, params: dict[str, float], bucket_size: int | None
) -> None:
    comp = create(name, **params, bucket_size=bucket_size)
    for n in (5, 1003) if bucket_size != 100 else (1, 8, 4099):
        for label, x in inputs(n).items():
            y = x + 0.05 * torch.randn(n, generator=torch.Generator().manual_seed(1))
            assert_fused_equals_torch(comp, x, y, (name, params, bucket_size, n, label))


@pytest.mark.parametrize(
    ("name", "params"),
    [("dqsg", {"M": 1}), ("ndqsg", {"L1": 3, "k": 3}), ("half_dither", {"M": 2, "dither_sum": 2})],
)
def test_fused_kernels_equal_torch_operations_across_tiles_and_dither_spans(
    name: str, params: dict[str, float]
) -> None:
    """Several tiles, with buckets of 100 that the decoders' dither spans of DITHER_SPAN cut
    through: the spans and the tiles must not show in the bytes or the values."""
    comp = create(name, **params, bucket_size=100)
    n = 2 * tile_elements(100, 10**6) + 1234
    assert DITHER_SPAN % 100 != 0
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, generator=gen)
    assert_fused_equals_torch(comp, x, x + 0.05 * torch.randn(n, generator=gen), (name, n))


def test_nested_decoder_takes_float64_for_a_bucket_whose_side_information_is_huge() -> None:
    """The float32 rule is decided per bucket on that bucket's own ``max|y|``; the kernel learns
    it while decoding, so a bucket that fails it (here one cut by a dither span) is decoded
    again in float64: the same bits as the torch twin, and ``decode_into_``'s too."""
    comp = create("ndqsg", L1=3, k=3, bucket_size=100)
    n = 5000
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(n, generator=gen)
    y = x + 0.05 * torch.randn(n, generator=gen)
    assert 1000 < DITHER_SPAN < 1100
    y[1050] = 4e30  # bucket 10 (elements 1000..1099): f * |y| >= 1e30
    y[3333] = -2e31
    assert_fused_equals_torch(comp, x, y, "huge side information")
    payload = comp.encode(x, KEY).payload
    into = torch.full((n,), 7.0)
    comp.decode_into_(payload, into, side=y)
    expected = comp.decode(payload, side=y)
    assert into.view(torch.int32).equal(expected.view(torch.int32))
    # decoding into the side information itself: the re-decoded bucket must still read the
    # original y (with this far side information it would decode one element differently)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=gen)
    far = x + 0.5 * torch.randn(n, generator=gen)
    far[1050] = 4e30
    payload = comp.encode(x, KEY).payload
    in_place = far.clone()
    comp.decode_into_(payload, in_place, side=in_place)
    expected = comp.decode(payload, side=far)
    assert in_place.view(torch.int32).equal(expected.view(torch.int32))


def test_fused_result_does_not_depend_on_the_thread_count() -> None:
    import numba

    comp = create("dqsg", M=2, bucket_size=100)
    x = torch.randn(50_003, generator=torch.Generator().manual_seed(2))
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = comp.encode(x, KEY).payload
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = comp.encode(x, KEY).payload
    finally:
        numba.set_num_threads(before)
    assert one == two


@pytest.mark.parametrize("bits", [1, 2, 3, 5, 8, 9, 13, 17, 32])
def test_torch_bit_packing_matches_the_codec_layout(bits: int) -> None:
    gen = torch.Generator().manual_seed(bits)
    for n in (0, 1, 7, 8, 9, 101):
        s = torch.randint(0, 2**bits, (n,), generator=gen, dtype=torch.int64)
        packed = pack_bits_torch(s, bits)
        assert torch.equal(packed, pack_bits(s, bits))
        assert torch.equal(unpack_bits_torch(packed, n, bits), s)


def test_fused_decode_rejects_symbols_outside_the_alphabet() -> None:
    comp = create("dqsg", M=1, bucket_size=None)  # 3 symbols in 2 bits: 3 is invalid
    payload = bytearray(comp.encode(torch.randn(64), KEY).payload)
    from gradzip.payload import build_payload, parse_payload

    header, body = parse_payload(bytes(payload))
    corrupt = bytearray(body)
    corrupt[4] = 0xFF  # after the 4-byte scale: four symbols of value 3
    with pytest.raises(CorruptPayloadError, match="alphabet"):
        comp.decode(build_payload(header, [bytes(corrupt)]))


def test_tiles_hold_whole_buckets_and_whole_bytes() -> None:
    for bucket_size in (0, 1, 3, 7, 8, 100, 512, 5000):
        unit = tile_elements(bucket_size, 10**6)
        assert unit % 8 == 0
        if bucket_size:
            assert unit % bucket_size == 0
