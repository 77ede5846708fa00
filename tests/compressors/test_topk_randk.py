"""top-k (deterministic, ties to the smaller index) and rand-k (shared-randomness indices)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import gradzip
from gradzip.codecs.bitpack import pack_bits
from gradzip.compressors.randk import randk_indices
from gradzip.compressors.topk import kept_count
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, parse_payload

KEY = StreamKey(run_seed=11, rank=2, step=7, tensor_index=1)
VALUES = st.floats(
    -(2.0**100), 2.0**100, allow_nan=False, allow_infinity=False, width=32
) | st.sampled_from([0.0, -1.0, 1.0, 2.0])


def reference_topk(x: np.ndarray, k: int) -> np.ndarray:
    """Sort by (-|x|, index) and keep the first k: the documented tie rule, by brute force."""
    order = np.lexsort((np.arange(x.size), -np.abs(x.astype(np.float64))))
    return np.sort(order[:k])


def sq(t: torch.Tensor) -> float:
    return float((t.double() ** 2).sum())


# -- top-k --------------------------------------------------------------------------------------


@given(arrays(np.float32, st.integers(1, 80), elements=VALUES), st.integers(1, 90))
def test_topk_contraction_and_selection(values: np.ndarray, k: int) -> None:
    x = torch.from_numpy(values.copy())
    comp = gradzip.create("topk", k=k)
    out = comp.decode(comp.encode(x, KEY).payload)
    d, kk = x.numel(), min(k, x.numel())
    assert sq(out - x) <= (1 - kk / d) * sq(x) * (1 + 1e-12)
    kept = np.zeros(d, dtype=bool)
    kept[reference_topk(values, kk)] = True
    assert torch.equal(out[torch.from_numpy(kept)], x[torch.from_numpy(kept)])
    assert bool((out[torch.from_numpy(~kept)] == 0).all())


def test_topk_ties_go_to_the_smaller_index() -> None:
    x = torch.tensor([0.5, 1.0, -1.0, 1.0, 2.0, -1.0])
    out = gradzip.create("topk", k=3).decode(gradzip.create("topk", k=3).encode(x).payload)
    assert out.tolist() == [0.0, 1.0, -1.0, 0.0, 2.0, 0.0]
    same = torch.full((10,), -3.0)
    out = gradzip.create("topk", k=4).decode(gradzip.create("topk", k=4).encode(same).payload)
    assert out.tolist() == [-3.0] * 4 + [0.0] * 6


def test_topk_ties_on_a_large_tensor() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-2, 3, (50_001,), generator=gen).float()  # five values: ties everywhere
    for k in (1, 777, 20_000, 50_000):
        comp = gradzip.create("topk", k=k)
        out = comp.decode(comp.encode(x, KEY).payload, shape=x.shape)  # k=1: 43 bytes
        kept = reference_topk(x.numpy(), k)
        expected = torch.zeros_like(x)
        expected[torch.from_numpy(kept)] = x[torch.from_numpy(kept)]
        assert torch.equal(out, expected)


@pytest.mark.parametrize("d", [1, 2, 3, 8, 9, 1000, 2**16 + 1])
@pytest.mark.parametrize("ratio", [0.001, 0.1, 0.5, 1.0])
def test_topk_body_bits_formula(d: int, ratio: float) -> None:
    comp = gradzip.create("topk", ratio=ratio)
    x = torch.randn(d, generator=torch.Generator().manual_seed(d))
    _, body = parse_payload(comp.encode(x, KEY).payload)
    k = max(1, min(d, math.floor(ratio * d + 0.5)))
    b = math.ceil(math.log2(d)) if d > 1 else 0
    assert 8 * len(body) == 32 * k + 8 * math.ceil(k * b / 8) == comp.expected_body_bits(x)
    assert comp.encode(x, KEY).paper_bits == k * (32 + b)


def test_k_and_ratio_rules() -> None:
    assert kept_count(5, 0.0, 3) == 3
    assert kept_count(0, 0.1, 4) == 1  # at least one kept
    assert kept_count(0, 0.25, 10) == 3  # round half up of 2.5
    for bad in ({}, {"k": 2, "ratio": 0.5}, {"k": 0}, {"ratio": 0.0}, {"ratio": 1.5}, {"k": True}):
        with pytest.raises(ValueError):
            gradzip.create("topk", **bad)
        with pytest.raises(ValueError):
            gradzip.create("randk", **bad)


def test_topk_decoder_validates_indices() -> None:
    comp = gradzip.create("topk", k=3)
    header, _ = parse_payload(comp.encode(torch.randn(10), KEY).payload)
    values = torch.ones(3).numpy().tobytes()

    def body(indices: list[int]) -> bytes:
        return build_payload(header, [values, bytes(pack_bits(torch.tensor(indices), 4).numpy())])

    assert comp.decode(body([0, 4, 9])).tolist() == [1, 0, 0, 0, 1, 0, 0, 0, 0, 1]
    with pytest.raises(CorruptPayloadError, match="strictly increasing"):
        comp.decode(body([0, 4, 4]))
    with pytest.raises(CorruptPayloadError, match="strictly increasing"):
        comp.decode(body([5, 4, 6]))
    with pytest.raises(CorruptPayloadError, match="out of range"):
        comp.decode(body([0, 4, 12]))
    with pytest.raises(TruncatedPayloadError):
        comp.decode(build_payload(header, [values]))


# -- rand-k -------------------------------------------------------------------------------------


def test_randk_is_deterministic_and_a_separate_receiver_regenerates_indices() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    enc = gradzip.create("randk", k=37).encode(x, KEY)
    assert enc.payload == gradzip.create("randk", k=37).encode(x, KEY).payload
    assert 8 * len(parse_payload(enc.payload)[1]) == 32 * 37
    out = gradzip.create("randk", k=37).decode(enc.payload, expected_key=KEY)
    kept = torch.from_numpy(randk_indices(KEY, 1000, 37))
    assert kept.numel() == 37 and bool((kept[1:] > kept[:-1]).all())
    assert torch.equal(out[kept], x[kept])
    assert int(torch.count_nonzero(out)) == 37


def test_randk_indices_change_with_every_key_field() -> None:
    base = randk_indices(KEY, 10_000, 100)
    for other in (
        KEY.with_step(8),
        StreamKey(12, 2, 7, 1),
        StreamKey(11, 3, 7, 1),
        StreamKey(11, 2, 7, 2),
        StreamKey(11, 2, 7, 1, chunk=1),
    ):
        assert not np.array_equal(base, randk_indices(other, 10_000, 100))
    assert np.array_equal(base, randk_indices(StreamKey(11, 2, 7, 1), 10_000, 100))


@pytest.mark.parametrize(("d", "k"), [(1, 1), (5, 5), (1000, 1), (100_003, 1234), (1000, 999)])
def test_randk_indices_are_a_sorted_subset_of_size_k(d: int, k: int) -> None:
    idx = randk_indices(KEY, d, k)
    assert idx.size == k and idx.min() >= 0 and idx.max() < d
    assert bool((np.diff(idx) > 0).all())


@pytest.mark.parametrize("k", [5, 15])
def test_randk_inclusion_is_uniform(k: int) -> None:
    """Each coordinate is kept with probability k/d: counts within 5 binomial sd."""
    d, trials = 20, 3000
    counts = np.zeros(d)
    for step in range(trials):
        counts[randk_indices(KEY.with_step(step), d, k)] += 1
    p = k / d
    sd = math.sqrt(trials * p * (1 - p))
    assert np.abs(counts - trials * p).max() <= 5 * sd


@pytest.mark.parametrize("scaled", [True, False])
def test_randk_mean_and_error(scaled: bool) -> None:
    """scaled: E C(x) = x and E||C(x)-x||^2 = (d/k-1)||x||^2; unscaled: (1-k/d)||x||^2."""
    d, k, trials = 16, 4, 2000
    x = torch.randn(d, generator=torch.Generator().manual_seed(9), dtype=torch.float64).float()
    comp = gradzip.create("randk", k=k, scaled=scaled)
    outs = torch.stack(
        [comp.decode(comp.encode(x, KEY.with_step(t)).payload) for t in range(trials)]
    ).double()
    xd = x.double()
    errs = ((outs - xd) ** 2).sum(dim=1)
    expected = (d / k - 1 if scaled else 1 - k / d) * float((xd**2).sum())
    assert abs(float(errs.mean()) - expected) <= 5 * float(errs.std()) / math.sqrt(trials)
    if scaled:
        sd = xd.abs() * math.sqrt(d / k - 1)  # per-coordinate sd of C(x)_i
        assert bool(((outs.mean(dim=0) - xd).abs() <= 5 * sd / math.sqrt(trials)).all())
    else:
        assert bool(((outs == 0) | (outs == x.double())).all())


def test_randk_wrong_body_size_raises() -> None:
    comp = gradzip.create("randk", k=3)
    header, body = parse_payload(comp.encode(torch.randn(10), KEY).payload)
    with pytest.raises(TruncatedPayloadError):
        comp.decode(build_payload(header, [bytes(body[:-4])]))
    with pytest.raises(CorruptPayloadError):
        comp.decode(build_payload(header, [bytes(body) + b"\0\0\0\0"]))


# -- the device path (issue 28): non-default configurations ---------------------------------
DEVICE_CASES = [
    ("topk", {"k": 1}, (1,)),
    ("topk", {"k": 5}, (7,)),
    ("topk", {"ratio": 1.0}, (100,)),
    ("topk", {"ratio": 0.3}, (33, 65)),
    ("topk", {"k": 300, "value_codec": "fp16"}, (4097,)),
    ("topk", {"k": 300, "value_codec": "bf16"}, (2049,)),
    ("topk", {"ratio": 0.01}, (70_000,)),  # 17-bit indices
    ("randk", {"k": 1}, (1,)),
    ("randk", {"ratio": 0.6}, (1000,)),  # most kept: the dropped set is drawn
    ("randk", {"ratio": 0.1, "scaled": True}, (33, 65)),
    ("randk", {"k": 40, "value_codec": "fp16"}, (999,)),
    ("randk", {"k": 40, "value_codec": "bf16", "scaled": True}, (999,)),
]


def _device_gradient(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.rand(shape, generator=g).pow(3)
    flat = x.view(-1)
    flat[::5] = flat[0]  # ties at every magnitude: the smaller index wins
    flat[1::9] = -0.0
    return x


@pytest.mark.parametrize(("name", "params", "shape"), DEVICE_CASES)
def test_device_path_equals_host_path(name: str, params: dict, shape: tuple[int, ...]) -> None:
    from tests.compressors.device_checks import check_device_decode, check_twin_bytes

    codec = gradzip.create(name, **params)
    assert codec.device_resident
    x = _device_gradient(shape)
    check_twin_bytes(codec, x, KEY)
    check_device_decode(codec, x, KEY)


@pytest.mark.parametrize(("name", "params", "shape"), DEVICE_CASES)
def test_device_path_encodes_fake_cuda(name: str, params: dict, shape: tuple[int, ...]) -> None:
    from tests.compressors.device_checks import encode_fake_cuda

    codec = gradzip.create(name, **params)
    assert encode_fake_cuda(codec, shape, KEY) == len(codec.encode(torch.randn(shape), KEY).payload)


@pytest.mark.parametrize("name", ["topk", "randk"])
def test_device_decode_add_keeps_negative_zero_where_nothing_is_kept(name: str) -> None:
    from gradzip.device.mode import forced_device_payloads
    from tests.compressors.device_checks import device_payload

    codec = gradzip.create(name, ratio=0.1)
    x = _device_gradient((500,))
    payload = device_payload(codec, x, KEY)
    host = bytes(codec.encode(x, KEY).payload)
    out = torch.full((500,), -0.0)
    want = codec.decode_add_(host, out.clone(), expected_key=KEY)
    with forced_device_payloads():
        got = codec.decode_add_(payload, out.clone(), expected_key=KEY)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert int((got.view(torch.int32) == torch.tensor(-0.0).view(torch.int32)).sum()) > 0


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("topk", {"ratio": 0.1, "index_coding": "rice"}),
        ("topk", {"ratio": 0.1, "value_codec": "qsgd"}),
        ("randk", {"ratio": 0.1, "value_codec": "dqsg"}),
    ],
)
def test_host_codings_are_not_device_resident(name: str, params: dict) -> None:
    assert not gradzip.create(name, **params).device_resident


@pytest.mark.parametrize("value_codec", ["fp32", "fp16"])
def test_corrupt_device_topk_indices_get_the_host_error(value_codec: str) -> None:
    from gradzip.device.crc32 import crc32_bytes_device
    from gradzip.device.mode import forced_device_payloads
    from tests.compressors.device_checks import device_payload

    codec = gradzip.create("topk", k=10, value_codec=value_codec)
    x = _device_gradient((1000,))
    payload = device_payload(codec, x, KEY).clone()
    # swap two packed index bytes (indices no longer increasing) and re-seal the CRC
    body_end = payload.numel() - 4
    a, b = int(payload[body_end - 12]), int(payload[body_end - 2])
    payload[body_end - 12], payload[body_end - 2] = b, a
    resealed = torch.cat([payload[:body_end], crc32_bytes_device(payload[:body_end])])
    with pytest.raises(CorruptPayloadError):
        codec.decode(bytes(resealed.numpy()), expected_key=KEY, shape=x.shape)
    with forced_device_payloads(), pytest.raises(CorruptPayloadError):
        codec.decode(resealed, expected_key=KEY, shape=x.shape)
