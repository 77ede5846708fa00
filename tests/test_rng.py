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
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
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
