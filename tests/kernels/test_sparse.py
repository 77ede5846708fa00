"""top-k / rand-k kernels: payloads byte-identical to the plain NumPy algorithms, torch twins
identical to the kernels, thread-count independence, and decode_add_ bitwise the dense sum."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
import torch

import gradzip
from gradzip.codecs.bitpack import pack_bits
from gradzip.compressors.randk import randk_indices
from gradzip.compressors.topk import index_bits, kept_count, topk_indices
from gradzip.errors import PayloadError
from gradzip.kernels.sparse import topk_select, topk_select_torch
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, parse_payload
from gradzip.rng import shared_words

KEY = StreamKey(run_seed=5, rank=1, step=3, tensor_index=2)
SIZES = [1, 2, 3, 9, 64, 1000, 65_537, 140_001]
RATIOS = [0.001, 0.01, 0.1, 0.5, 0.7, 1.0]


def sample(d: int, kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal(d).astype(np.float32)
    if kind == "ties":  # few distinct magnitudes, both signs: the tie rule decides
        return rng.integers(-3, 4, d).astype(np.float32)
    x = np.zeros(d, dtype=np.float32)  # signed zeros and subnormals
    x[::3] = -0.0
    x[1::5] = np.float32(1e-45) * rng.integers(1, 9, x[1::5].size)
    return x


def reference_randk(key: StreamKey, d: int, k: int) -> np.ndarray:
    """The NumPy-only rand-k subset the kernels replaced (same word stream, same arithmetic)."""

    def uniform(words, count):  # type: ignore[no-untyped-def]
        raw = words.random_raw(count)
        return ((raw >> np.uint64(32)) * np.uint64(d) >> np.uint64(32)).astype(np.int64)

    def subset(words, m):  # type: ignore[no-untyped-def]
        mask = np.zeros(d, dtype=np.bool_)
        marked = 0
        while marked < m:
            need = -d * math.log1p(-(m - marked) / (d - marked))
            mask[uniform(words, int(need + 4 * math.sqrt(need) + 16))] = True
            marked = int(np.count_nonzero(mask))
        chosen = np.flatnonzero(mask)
        if marked == m:
            return chosen
        keys = words.random_raw(marked)
        keys = (keys >> np.uint64(31) << np.uint64(31)) | np.arange(marked, dtype=np.uint64)
        return np.delete(chosen, np.argpartition(keys, marked - m - 1)[: marked - m])

    if k >= d:
        return np.arange(d, dtype=np.int64)
    words = shared_words(key)
    if 2 * k <= d:
        return subset(words, k)
    keep = np.ones(d, dtype=np.bool_)
    keep[subset(words, d - k)] = False
    return np.flatnonzero(keep)


@pytest.mark.parametrize("kind", ["normal", "ties", "zeros"])
def test_topk_body_is_the_reference_bytes(kind: str) -> None:
    for seed, d in enumerate(SIZES):
        x = sample(d, kind, seed)
        for ratio in RATIOS:
            k = kept_count(0, ratio, d)
            idx = topk_indices(x, k)  # the plain NumPy selection
            expected = x[idx].tobytes()
            if index_bits(d):
                expected += pack_bits(torch.from_numpy(idx), index_bits(d)).numpy().tobytes()
            payload = gradzip.create("topk", ratio=ratio).encode(torch.from_numpy(x), KEY).payload
            assert bytes(parse_payload(payload)[1]) == expected, (kind, d, ratio)


@pytest.mark.parametrize("kind", ["normal", "ties", "zeros"])
def test_topk_torch_twin_equals_kernel(kind: str) -> None:
    for seed, d in enumerate(SIZES):
        x = sample(d, kind, seed)
        for k in sorted({1, max(1, d // 100), max(1, d // 2), d}):
            kernel = topk_select(x, k)
            assert np.array_equal(kernel, topk_indices(x, k))
            assert np.array_equal(topk_select_torch(torch.from_numpy(x), k).numpy(), kernel)


def test_randk_indices_are_the_reference_subset() -> None:
    for seed, d in enumerate(SIZES):
        key = StreamKey(run_seed=seed, rank=seed % 3, step=seed, tensor_index=1)
        for ratio in RATIOS:
            k = kept_count(0, ratio, d)
            assert np.array_equal(randk_indices(key, d, k), reference_randk(key, d, k)), (d, k)


def test_randk_body_is_the_kept_values() -> None:
    x = sample(140_001, "normal", 3)
    for ratio in RATIOS:
        k = kept_count(0, ratio, x.size)
        payload = gradzip.create("randk", ratio=ratio).encode(torch.from_numpy(x), KEY).payload
        expected = x[reference_randk(KEY, x.size, k)].tobytes()
        assert bytes(parse_payload(payload)[1]) == expected


@pytest.mark.parametrize("name", ["topk", "randk"])
def test_payload_does_not_depend_on_thread_count(name: str) -> None:
    x = torch.from_numpy(sample(300_007, "ties", 9))
    codec = gradzip.create(name, ratio=0.05)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = codec.encode(x, KEY).payload
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = codec.encode(x, KEY).payload
    finally:
        numba.set_num_threads(before)
    assert bytes(one) == bytes(many)


def peers(codec: gradzip.Compressor, d: int, dtype: torch.dtype) -> list[bytes]:
    out = []
    for rank in range(4):
        x = torch.from_numpy(sample(d, "ties" if rank % 2 else "normal", rank)).to(dtype)
        if rank == 2:
            x[::7] = -0.0
        out.append(codec.encode(x, KEY.__class__(run_seed=5, rank=rank, step=3)).payload)
    return out


@pytest.mark.parametrize(
    ("name", "params"),
    [("topk", {"ratio": 0.1}), ("randk", {"ratio": 0.1}), ("randk", {"k": 50, "scaled": True})],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_decode_add_is_bitwise_the_dense_sum(
    name: str, params: dict[str, object], dtype: torch.dtype
) -> None:
    codec = gradzip.create(name, **params)
    d = 3001
    work = torch.float64 if dtype == torch.float64 else torch.float32
    dense = torch.zeros(d, dtype=work)
    sparse = torch.zeros(d, dtype=work)
    for rank, payload in enumerate(peers(codec, d, dtype)):
        key = StreamKey(run_seed=5, rank=rank, step=3)
        dense += codec.decode(payload, expected_key=key, shape=(d,), dtype=dtype)
        codec.decode_add_(payload, sparse, expected_key=key, dtype=dtype)
        assert dense.numpy().tobytes() == sparse.numpy().tobytes()


def test_default_decode_add_adds_the_decoded_tensor() -> None:
    codec = gradzip.create("dqsg", M=2)
    x = torch.randn(500, generator=torch.Generator().manual_seed(1))
    payload = codec.encode(x, KEY).payload
    out = torch.ones(500)
    codec.decode_add_(payload, out, expected_key=KEY)
    assert torch.equal(out, 1 + codec.decode(payload, expected_key=KEY, shape=(500,)))


def corrupt_topk(values: np.ndarray, idx: list[int], d: int) -> bytes:
    codec = gradzip.create("topk", k=len(idx))
    good = codec.encode(torch.ones(d), KEY).payload
    header, _ = parse_payload(good)
    body = values.astype(np.float32).tobytes()
    body += pack_bits(torch.tensor(idx), index_bits(d)).numpy().tobytes()
    return build_payload(header, [body])


@pytest.mark.parametrize(
    ("values", "idx", "message"),
    [
        ([1.0, 2.0, 3.0], [0, 5, 5], "not strictly increasing"),
        ([1.0, 2.0, 3.0], [4, 2, 9], "not strictly increasing"),
        ([1.0, 2.0, 3.0], [1, 5, 1000], "out of range"),
        ([1.0, float("nan"), 3.0], [1, 5, 9], "non-finite"),
        ([1.0, float("inf"), 3.0], [1, 5, 9], "non-finite"),
    ],
)
def test_corrupt_topk_payload_raises_before_touching_out(
    values: list[float], idx: list[int], message: str
) -> None:
    d = 1000
    payload = corrupt_topk(np.array(values), idx, d)
    codec = gradzip.create("topk", k=3)
    with pytest.raises(PayloadError, match=message) as dense_error:
        codec.decode(payload, shape=(d,))
    out = torch.full((d,), 7.0)
    with pytest.raises(type(dense_error.value), match=message):
        codec.decode_add_(payload, out)
    assert torch.equal(out, torch.full((d,), 7.0))


def test_set_padding_bit_is_refused_by_both_paths() -> None:
    d = 1000  # 10 bits per index: 3 indices leave 2 padding bits
    payload = bytearray(corrupt_topk(np.array([1.0, 2.0, 3.0]), [1, 5, 9], d))
    header, body = parse_payload(bytes(payload))
    body = bytearray(body)
    body[-1] |= 0x80
    bad = build_payload(header, [bytes(body)])
    codec = gradzip.create("topk", k=3)
    out = torch.zeros(d)
    for call in (lambda: codec.decode(bad, shape=(d,)), lambda: codec.decode_add_(bad, out)):
        with pytest.raises(PayloadError, match="padding"):
            call()
    assert not bool(out.any())


def test_randk_scaled_saturates_and_unscaled_refuses_inf_in_both_paths() -> None:
    d, k = 100, 10
    for scaled in (False, True):
        codec = gradzip.create("randk", k=k, scaled=scaled)
        header, _ = parse_payload(codec.encode(torch.ones(d), KEY).payload)
        values = np.full(k, np.float32(3e38))
        values[0] = np.inf
        payload = build_payload(header, [values.tobytes()])
        out = torch.zeros(d)
        if scaled:  # decode saturates at float32's maximum: decode_add_ adds the same values
            dense = codec.decode(payload, shape=(d,))
            codec.decode_add_(payload, out)
            assert torch.equal(out, dense)
        else:
            with pytest.raises(PayloadError, match="non-finite"):
                codec.decode(payload, shape=(d,))
            with pytest.raises(PayloadError, match="non-finite"):
                codec.decode_add_(payload, out)
            assert not bool(out.any())


def test_topk_sampled_selection_equals_the_reference_where_the_sample_misleads() -> None:
    """Large tensors at small k start from a sampled floor (checked, with the full selection as
    the fallback): normal data, all ties, a periodic pattern and one aliased with the sample's
    stride must all give the reference indices."""
    from gradzip.kernels.sparse import _SAMPLE, _SAMPLED_FROM

    d = 2 * _SAMPLED_FROM
    stride = d // _SAMPLE
    gen = np.random.default_rng(4)
    cases = {
        "normal": gen.standard_normal(d).astype(np.float32),
        "ties": np.ones(d, dtype=np.float32),
        "periodic": np.tile(np.float32([5, 1, 1, 1]), d // 4),
        # large values exactly where the sample looks: it sees only them
        "aliased": (np.arange(d) % stride == 0).astype(np.float32) * 3 + 1,
        # large values everywhere but where the sample looks: it sees none of them
        "hidden": (np.arange(d) % stride != 0).astype(np.float32) * 3 + 1,
    }
    for name, x in cases.items():
        for k in (1, 37, d // 1000, d // 100, d // 50):
            assert np.array_equal(topk_select(x, k), topk_indices(x, k)), (name, k)


@pytest.mark.parametrize("bits", [1, 3, 7, 8, 9, 17, 24, 31, 32])
@pytest.mark.parametrize("n", [1, 7, 8, 13, 100])
def test_device_index_packing_equals_the_kernel(bits: int, n: int) -> None:
    from gradzip.kernels.sparse import pack_indices, unpack_indices
    from gradzip.kernels.sparse_device import (
        indices_valid_device,
        pack_indices_device,
        packed_size,
        unpack_indices_device,
    )

    rng = np.random.default_rng(bits * 1000 + n)
    d = 1 << bits
    idx = np.sort(rng.choice(min(d, 1 << 20), size=min(n, d), replace=False)).astype(np.int64)
    if bits == 32:
        idx[-1] = d - 1  # the top bit set
    out = np.empty(packed_size(idx.size, bits), dtype=np.uint8)
    pack_indices(idx, bits, out)
    device = pack_indices_device(torch.from_numpy(idx), bits)
    assert bytes(device.numpy()) == out.tobytes()
    back = unpack_indices_device(device, idx.size, bits)
    assert torch.equal(back, torch.from_numpy(unpack_indices(out, idx.size, bits, d)[0]))
    assert bool(indices_valid_device(device, back, bits, d))


@pytest.mark.parametrize("k", [1, 5, 64, 999])
def test_device_topk_select_equals_the_kernel(k: int) -> None:
    from gradzip.kernels.sparse_device import topk_select_device

    rng = np.random.default_rng(k)
    x = rng.standard_normal(1000).astype(np.float32)
    x[::3] = x[1]  # ties
    x[::7] = -x[1]
    x[::11] = 0.0
    x[5::13] = -0.0
    assert np.array_equal(topk_select_device(torch.from_numpy(x), k).numpy(), topk_select(x, k))
