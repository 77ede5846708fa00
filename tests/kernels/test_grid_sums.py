"""The fused integer-sum kernels give the bits of the torch formulation they replace."""

from __future__ import annotations

import pytest
import torch

import gradzip
from gradzip.kernels.grid_sums import add_scaled, mean_from_sums, requantize
from gradzip.rng import derive_seed, local_uniform, shared_uniform_plus_one_from_seed
from gradzip.schemes import make_scheme


@pytest.mark.parametrize("sum_dtype", [torch.float32, torch.int32, torch.uint8])
@pytest.mark.parametrize("codec", ["dqsg", "qsgd"])
def test_decode_sum_equals_net_levels_then_values(codec: str, sum_dtype: torch.dtype) -> None:
    """float32 sums (the re-quantizing ring's), int32 sums (the integer all-reduce's) and
    uint8 symbols (one rank's, for error feedback's own values) take the fused pass and give
    the bits of the two-step torch formulation."""
    scheme = make_scheme("ring_allreduce", gradzip.create(codec), run_seed=0)
    n = 100_003  # not a multiple of a tile, a bucket or a Philox block
    g = torch.Generator().manual_seed(1)
    sums = torch.randint(0, 9, (n,), generator=g).to(sum_dtype)
    bucket = scheme.grid.grid_bucket_size(n)
    scales = torch.rand(1 if bucket == 0 else -(-n // bucket), generator=g)
    keys = [scheme.key(p, 3, 0) for p in range(4)]
    # (_net_levels works in place on a float32 sum: give it a copy)
    expected = scheme._values(scheme._net_levels(sums.clone(), keys), scales, 4)
    assert expected.dtype == torch.float32
    assert torch.equal(scheme._decode_sum(sums, scales, 3, 0, 4), expected)


def test_requantize_equals_torch_rounding() -> None:
    scheme = make_scheme("ring_allreduce", gradzip.create("dqsg"), run_seed=0)
    key = scheme.key(1, 3, 0, 5)
    n = 70_001
    x = torch.rand(n, generator=torch.Generator().manual_seed(2)) * 8
    factor = torch.tensor(3 / 8, dtype=torch.float32)
    expected = (x * factor).add_(local_uniform(key, n)).floor_().clamp_(0, 3).to(torch.int32)
    assert torch.equal(requantize(x, 3 / 8, derive_seed(key, domain="local"), 3), expected)


def test_add_scaled_equals_multiply_then_add() -> None:
    g = torch.Generator().manual_seed(3)
    acc = torch.rand(1001, generator=g)
    q = torch.randint(0, 7, (1001,), generator=g, dtype=torch.int32)
    unit = 8 / 3
    expected = acc + q.float().mul_(torch.tensor(unit, dtype=torch.float32))
    add_scaled(acc, q, unit)
    assert torch.equal(acc, expected)


def test_mean_from_sums_refuses_steps_that_do_not_cover_the_buckets() -> None:
    with pytest.raises(ValueError, match="steps do not match"):
        mean_from_sums(torch.zeros(10), 0, [], torch.ones(2), 4)


def test_mean_from_sums_refuses_sums_of_another_dtype() -> None:
    with pytest.raises(ValueError, match="float32, int32 or uint8 sums"):
        mean_from_sums(torch.zeros(10, dtype=torch.int64), 0, [], torch.ones(1), 0)


@pytest.mark.parametrize("sum_dtype", [torch.float32, torch.int32])
@pytest.mark.parametrize("seeds", [[], [11, 2**40 + 5]])
@pytest.mark.parametrize("bucket", [0, 5, 1000, 20_000])
def test_mean_from_sums_equals_the_torch_formulation_per_bucket(
    seeds: list[int], bucket: int, sum_dtype: torch.dtype
) -> None:
    """Buckets smaller than, equal to no multiple of, and larger than the kernel's tile (16 K
    values), with and without dithers, from float32 or int32 sums: ``(float32(sums) - base -
    offsets) * step[i // bucket]``."""
    n = 50_003
    g = torch.Generator().manual_seed(bucket + len(seeds))
    sums = torch.randint(0, 17, (n,), generator=g).to(sum_dtype)
    steps = torch.rand(1 if bucket == 0 else -(-n // bucket), generator=g) + 0.5
    levels = sums.float() - 8
    for seed in seeds:
        levels -= shared_uniform_plus_one_from_seed(seed, n) - 1.5
    index = torch.zeros(n, dtype=torch.long) if bucket == 0 else torch.arange(n) // bucket
    expected = levels * steps[index]
    assert torch.equal(mean_from_sums(sums, 8, seeds, steps, bucket), expected)
