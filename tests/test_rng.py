"""Shared and local randomness: keyed, reproducible across objects, independent of global RNG."""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np
import pytest
import torch

from gradzip.keys import StreamKey
from gradzip.rng import derive_seed, local_uniform, shared_uniform

KEY = StreamKey(run_seed=1234, rank=2, step=17, tensor_index=5)


def test_seed_follows_the_spec_formula() -> None:
    digest = hashlib.sha256(b"1234:2:17:5").digest()
    assert derive_seed(KEY) == int.from_bytes(digest[:8], "little") & (2**63 - 1)


def test_chunk_and_domain_separate_streams() -> None:
    seeds = {
        derive_seed(KEY),
        derive_seed(StreamKey(1234, 2, 17, 5, chunk=1)),
        derive_seed(KEY, domain="local"),
    }
    assert len(seeds) == 3
    with pytest.raises(ValueError):
        derive_seed(KEY, domain="global")


def test_sender_and_receiver_regenerate_identical_dither() -> None:
    sender = shared_uniform(StreamKey(1234, 2, 17, 5), 10_001)
    receiver = shared_uniform(StreamKey(run_seed=1234, rank=2, step=17, tensor_index=5), 10_001)
    assert sender.dtype == torch.float32
    assert torch.equal(sender, receiver)


def test_prefix_property_and_odd_lengths() -> None:
    long = shared_uniform(KEY, 1001)
    short = shared_uniform(KEY, 7)
    assert torch.equal(long[:7], short)
    assert shared_uniform(KEY, 0).numel() == 0


def test_every_key_field_changes_the_stream() -> None:
    base = shared_uniform(KEY, 64)
    for changed in (
        StreamKey(1235, 2, 17, 5),
        StreamKey(1234, 3, 17, 5),
        StreamKey(1234, 2, 18, 5),
        StreamKey(1234, 2, 17, 6),
        StreamKey(1234, 2, 17, 5, 1),
    ):
        assert not torch.equal(base, shared_uniform(changed, 64))
    assert not torch.equal(base, local_uniform(KEY, 64))


def test_uniforms_are_uniform_on_unit_interval() -> None:
    n = 400_000
    u = shared_uniform(KEY, n).double()
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0  # midpoints: never 0 or 1
    # mean 1/2 and variance 1/12 within 5 standard errors
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / n)
    var_se = math.sqrt((1 / 80 - 1 / 144) / n)  # Var of (u - 1/2)^2 is 1/80 - 1/144
    assert abs(float(u.var()) - 1 / 12) < 5 * var_se
    # 16-bin chi-square with 15 degrees of freedom: 99.99th percentile is about 44
    counts = torch.bincount((u * 16).long(), minlength=16).double()
    chi2 = float(((counts - n / 16) ** 2 / (n / 16)).sum())
    assert chi2 < 44.3
    # consecutive values uncorrelated
    corr = float(torch.corrcoef(torch.stack((u[:-1], u[1:])))[0, 1])
    assert abs(corr) < 5 / math.sqrt(n)


def test_global_rngs_untouched() -> None:
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    shared_uniform(KEY, 1000)
    local_uniform(KEY, 1000)
    after = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], after[0])
    assert np.array_equal(expected[1], after[1])
    assert expected[2] == after[2]


def test_device_argument_returns_same_values() -> None:
    assert torch.equal(shared_uniform(KEY, 33, device="cpu"), shared_uniform(KEY, 33))


def test_key_validation() -> None:
    with pytest.raises(ValueError):
        StreamKey(rank=-1)
    with pytest.raises(TypeError):
        StreamKey(step=1.5)  # type: ignore[arg-type]
    assert StreamKey(step=3).with_step(4) == StreamKey(step=4)


# -- Philox4x32-10: the generator behind every stream ------------------------------------------

# Random123's known-answer vectors (its tests/kat_vectors) for Philox4x32-10
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), PHILOX_KAT)
def test_philox_known_answers_numba_and_torch(
    counter: tuple[int, int, int, int], key: tuple[int, int], expected: tuple[int, ...]
) -> None:
    from gradzip.kernels.philox import philox_block
    from gradzip.kernels.philox_torch import philox4x32_10_torch

    assert philox_block(counter, key) == expected
    words = philox4x32_10_torch(*(torch.tensor([c]) for c in counter), *key)
    assert tuple(int(w) for w in words) == expected


def _documented_uniform(word: int, half: int) -> float:
    """``u`` of the documented float layout: the 16-bit half ``half`` (0 low, 1 high) of
    ``word``, as the midpoint ``(h + 1/2) * 2**-16`` (exact in float32 and float64)."""
    h = (word >> (16 * half)) & 0xFFFF
    return (h + 0.5) * 2.0**-16


def test_stream_layout_is_the_documented_one() -> None:
    """Word j is word j % 4 of the block with counter (j//4 low, j//4 high, domain, 0); float
    element i is half i % 2 (low first) of word i // 2, so a block holds 8 floats. Checked
    against single Random123-verified blocks, for the CPU stream and the torch twin."""
    from gradzip.kernels.philox import SHARED_UNIFORM, philox_block
    from gradzip.kernels.philox_torch import philox_one_plus_uniform_torch

    seed = derive_seed(KEY)
    key = (seed & 0xFFFFFFFF, seed >> 32)
    u = shared_uniform(KEY, 24)
    twin = philox_one_plus_uniform_torch(seed, SHARED_UNIFORM, 0, 24) - 1.0
    for i in range(24):
        w = philox_block((i // 8, 0, SHARED_UNIFORM, 0), key)[(i // 2) % 4]
        assert float(u[i]) == float(twin[i]) == _documented_uniform(w, i % 2)


@pytest.mark.parametrize("offset", [0, 1, 5, 8, 13, 4 * 2**32 - 3, 8 * 2**32 - 7])
@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 17, 300])
def test_float_element_is_the_documented_function_of_its_word(offset: int, n: int) -> None:
    """Float element i (at any offset and length: the kernels' head, whole-block and tail
    paths) is ``0x3F800000 | (h << 7) | 0x40`` with ``h`` half i % 2 of word i // 2 of the
    same domain's word stream, in the numba kernel and in the torch twin."""
    from gradzip.kernels.philox import philox_one_plus_uniform, philox_words
    from gradzip.kernels.philox_torch import philox_one_plus_uniform_torch

    seed = (1 << 62) + 4242
    first = offset // 2
    words = philox_words(seed, 1, first, (offset + n - 1) // 2 - first + 1)
    expected = np.array(
        [
            0x3F800000 | (((int(words[i // 2 - first]) >> (16 * (i % 2))) & 0xFFFF) << 7) | 0x40
            for i in range(offset, offset + n)
        ],
        dtype=np.uint32,
    )
    fast = philox_one_plus_uniform(seed, 1, offset, n)
    assert np.array_equal(fast.view(np.uint32), expected)
    twin = philox_one_plus_uniform_torch(seed, 1, offset, n)
    assert np.array_equal(twin.numpy().view(np.uint32), expected)


def test_the_16_bit_uniforms_are_unbiased_midpoints() -> None:
    """[CHOICE] check: the 2**16 values of ``u`` are the midpoints of equal cells of (0, 1), so
    their mean is exactly 1/2, they are symmetric (u and 1 - u both occur), and a stochastic
    rounding up with probability P(u < p) misses p by at most 2**-17 for every p."""
    from gradzip.kernels.philox import one_plus_uniform_bits
    from gradzip.kernels.philox_torch import one_plus_uniform_from_halves

    halves = torch.arange(2**16, dtype=torch.int64)
    ones = one_plus_uniform_from_halves(halves)
    numba_bits = np.array([one_plus_uniform_bits(h) for h in range(0, 2**16, 997)], np.uint32)
    assert np.array_equal(numba_bits, ones.numpy().view(np.uint32)[::997])
    u = ones.double() - 1.0  # exact: float32 1 + u and u are both on the 2**-17 grid
    assert float(u[0]) == 2.0**-17 and float(u[-1]) == 1 - 2.0**-17
    assert torch.equal(u + u.flip(0), torch.ones_like(u))  # symmetric about 1/2
    assert float(u.sum()) == 2.0**15  # mean exactly 1/2 (the sum is exact in float64)
    assert torch.equal(u[1:] - u[:-1], torch.full((2**16 - 1,), 2.0**-16, dtype=torch.float64))
    p = torch.linspace(0, 1, 10_007, dtype=torch.float64)
    rounds_up = torch.searchsorted(u, p).double() / 2**16  # P(u < p): midpoints below p
    assert float((rounds_up - p).abs().max()) <= 2.0**-17


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 1000, 2**20 + 3])
@pytest.mark.parametrize("offset", [0, 1, 2, 3, 4, 2**32 * 4 - 2])
def test_numba_and_torch_streams_agree_bitwise(n: int, offset: int) -> None:
    from gradzip.kernels.philox import philox_words
    from gradzip.kernels.philox_torch import philox_words_torch

    if n > 5000 and offset not in (0, 3):
        pytest.skip("long streams are checked at two offsets (keeps the suite fast)")
    seed = (1 << 62) + 987654321
    fast = philox_words(seed, 1, offset, n)
    ref = philox_words_torch(seed, 1, offset, n)
    assert fast.dtype == np.uint32 and fast.size == n
    assert np.array_equal(fast.astype(np.int64), ref.numpy())


def test_device_path_gives_the_cpu_stream() -> None:
    from gradzip.kernels.philox import philox_one_plus_uniform
    from gradzip.kernels.philox_torch import philox_one_plus_uniform_torch

    seed = derive_seed(KEY)
    fast = torch.from_numpy(philox_one_plus_uniform(seed, 0, 5, 4099))
    assert torch.equal(fast, philox_one_plus_uniform_torch(seed, 0, 5, 4099))
    assert torch.equal(shared_uniform(KEY, 4099)[5:], fast.sub(1.0)[:4094])


def test_stream_does_not_depend_on_the_thread_count() -> None:
    import numba

    from gradzip.kernels.philox import philox_words

    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = philox_words(12345, 0, 7, 3 * 2**16 + 5)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = philox_words(12345, 0, 7, 3 * 2**16 + 5)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(one, two)


def test_uniforms_pass_kolmogorov_smirnov() -> None:
    """KS distance of 200k shared uniforms to U[0, 1): below the 0.1% critical value
    1.95/sqrt(n) (the 16-bit midpoint grid's CDF is within 2**-17 of the uniform CDF)."""
    n = 200_000
    u = np.sort(shared_uniform(KEY, n).numpy().astype(np.float64))
    grid = np.arange(1, n + 1) / n
    distance = max(float(np.max(grid - u)), float(np.max(u - (grid - 1 / n))))
    assert distance < 1.95 / math.sqrt(n) + 2.0**-17


def test_shared_words_continue_one_stream() -> None:
    from gradzip.kernels.philox import SHARED_WORDS, philox_words
    from gradzip.rng import shared_words

    words = shared_words(KEY)
    first, second = words.random_raw(3), words.random_raw(5)
    assert first.dtype == np.uint64
    whole = philox_words(derive_seed(KEY), SHARED_WORDS, 0, 16).astype(np.uint64)
    expected = whole[0::2] | (whole[1::2] << np.uint64(32))
    assert np.array_equal(np.concatenate((first, second)), expected)
    assert np.array_equal(shared_words(KEY).random_raw(8), expected)


def test_parallel_kernels_leave_torch_thread_count_alone() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        shared_uniform(KEY, 3 * 2**16)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("offset", [0, 3, 8 * 2**32 - 6, 8 * 2**32 - 67, 8 * 2**33 - 1])
def test_float_stream_agrees_across_the_counter_high_word(offset: int) -> None:
    """fill_uniform splits its blocks where the counter's high word changes (every 2**32
    blocks, i.e. every 8 * 2**32 floats): the float32 ``1 + u`` stream is the torch twin's on
    both sides of the split (from the head, the whole blocks or the tail)."""
    from gradzip.kernels.philox import philox_one_plus_uniform
    from gradzip.kernels.philox_torch import philox_one_plus_uniform_torch

    seed = (1 << 62) + 12345
    fast = torch.from_numpy(philox_one_plus_uniform(seed, 0, offset, 103))
    assert torch.equal(fast, philox_one_plus_uniform_torch(seed, 0, offset, 103))
