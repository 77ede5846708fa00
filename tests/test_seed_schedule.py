"""Seed schedules (spec 0.4): the keyed default is unchanged; ``"chain"`` follows the DQSG/NDQSG
authors' rule, keeps sender and receiver in step, and survives a resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradzip.compressors.dqsg import DQSG
from gradzip.compressors.ndqsg import NDQSG
from gradzip.errors import PayloadMismatchError
from gradzip.kernels.backend import forced_torch_ops
from gradzip.keys import StreamKey
from gradzip.rng import derive_seed, seed_from_text, shared_uniform_from_seed
from gradzip.seed_schedule import (
    ChainSeeds,
    SeedSchedule,
    chain_next_seed,
    chain_start_seed,
)

# FC-300-100 (784-300-100-10): the authors draw one uniform per weight, then per bias
FC_SHAPES = [(784, 300), (300, 100), (100, 10), (300,), (100,), (10,)]
FC_DRAWS = sum(int(np.prod(shape)) for shape in FC_SHAPES)


def authors_next_seed(seed: int, shapes: list[tuple[int, ...]]) -> int:
    """The rule as the authors' worker applies it: re-seed, one dither draw per tensor, then
    the next seed from the same stream (a private RandomState stands for the global one)."""
    stream = np.random.RandomState(seed)
    for shape in shapes:
        stream.uniform(-0.5, 0.5, size=shape)
    return int(stream.randint(1000, 1000000))


def test_chain_follows_the_authors_rule_on_known_seeds() -> None:
    assert FC_DRAWS == 266610
    for seed in (1000, 798946, 999999, 123456):
        assert chain_next_seed(seed, FC_DRAWS) == authors_next_seed(seed, FC_SHAPES)
    assert chain_next_seed(798946, 0) == authors_next_seed(798946, [])
    # pinned values, so a change of the rule (or of NumPy's legacy stream) is caught
    assert chain_next_seed(798946, FC_DRAWS) == 125879
    assert chain_next_seed(798946, 0) == 841511


def test_chain_seeds_iterate_the_rule_from_the_start_seed() -> None:
    chains = ChainSeeds(1000)
    expected = [chain_start_seed(0, 0)]
    for _ in range(3):
        expected.append(authors_next_seed(expected[-1], [(1000,)]))
    assert [chains.seed(0, 0, t) for t in range(4)] == expected
    assert expected == [168546, 549206, 490383, 405963]
    assert all(1000 <= s < 1000000 for s in expected)


def test_chain_state_is_a_function_of_the_step_so_a_resume_agrees() -> None:
    walked = SeedSchedule("chain", chain_draws=500)
    seeds = [walked.shared_seed(StreamKey(3, 2, t, 1)) for t in range(40)]
    resumed = SeedSchedule("chain", chain_draws=500)  # a fresh process after a checkpoint
    assert resumed.shared_seed(StreamKey(3, 2, 39, 1)) == seeds[39]
    assert resumed.shared_seed(StreamKey(3, 2, 17, 1)) == seeds[17]


def test_chain_message_seed_is_named_by_the_chain_seed_tensor_and_chunk() -> None:
    schedule = SeedSchedule("chain", chain_draws=10)
    chained = ChainSeeds(10).seed(5, 1, 7)
    assert schedule.shared_seed(StreamKey(5, 1, 7, 2)) == seed_from_text(f"chain:{chained}:2")
    assert schedule.shared_seed(StreamKey(5, 1, 7, 2, 3)) == seed_from_text(f"chain:{chained}:2:3")


def test_keyed_default_is_the_key_derivation() -> None:
    key = StreamKey(11, 3, 42, 5, 1)
    assert SeedSchedule().shared_seed(key) == derive_seed(key, domain="shared")
    assert SeedSchedule().wire_params() == {}
    assert DQSG(M=2).wire_params() == {"M": 2, "partitions": 0, "packing": "fixed"}


@pytest.mark.parametrize(
    ("schedule", "draws", "message"),
    [("chained", None, "seed_schedule must be one of"), ("chain", None, "needs chain_draws"),
     ("chain", -1, "needs chain_draws"), ("keyed", 5, "applies only")],
)  # fmt: skip
def test_bad_schedules_are_refused(schedule: str, draws: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DQSG(seed_schedule=schedule, chain_draws=draws)


def test_sender_and_receiver_ranks_derive_the_same_dither() -> None:
    """Sender (worker 2) and receiver (server) hold separate compressors; the receiver meets the
    worker's messages out of order, as after a resume. Decoding is then exact to the sender's
    own reconstruction and within the dithered quantizer's bound ``sigma/(2M)``."""
    torch.manual_seed(0)
    sender = DQSG(M=2, bucket_size=None, seed_schedule="chain", chain_draws=FC_DRAWS)
    receiver = DQSG(M=2, bucket_size=None, seed_schedule="chain", chain_draws=FC_DRAWS)
    reference = DQSG(M=2, bucket_size=None, seed_schedule="chain", chain_draws=FC_DRAWS)
    grads = {t: torch.randn(4096) for t in (0, 1, 2, 9)}
    payloads = {t: sender.encode(g, StreamKey(1, 2, t, 0)).payload for t, g in grads.items()}
    in_order = {t: reference.decode(payloads[t]) for t in sorted(payloads)}
    for t in (9, 0, 2, 1):
        decoded = receiver.decode(payloads[t])
        assert torch.equal(decoded, in_order[t])
        sigma = float(grads[t].abs().max())
        assert float((decoded - grads[t]).abs().max()) <= sigma / 4 * (1 + 1e-5)


def test_a_wrong_chain_fails_statistically() -> None:
    """The dither is the Philox stream of the chained seed: decoding with the keyed seed's
    dither (a receiver with a wrong chain) breaks the uniform error bound on most elements."""
    x = torch.randn(4096)
    sender = DQSG(M=1, bucket_size=None, seed_schedule="chain", chain_draws=100)
    key = StreamKey(0, 1, 3, 0)
    payload = sender.encode(x, key).payload
    good = sender.decode(payload)
    seed = sender.seed_schedule.shared_seed(key)
    sigma = float(x.abs().max())
    q = torch.round(good / sigma + shared_uniform_from_seed(seed, 4096) - 0.5)
    wrong = sigma * (q - (shared_uniform_from_seed(derive_seed(key), 4096) - 0.5))
    assert float((good - x).abs().max()) <= sigma / 2 * (1 + 1e-5)
    assert float(((wrong - x).abs() > sigma / 2).float().mean()) > 0.1


def test_a_receiver_on_the_other_schedule_refuses_the_payload() -> None:
    x = torch.randn(100)
    chained = DQSG(seed_schedule="chain", chain_draws=7).encode(x, StreamKey()).payload
    with pytest.raises(PayloadMismatchError):
        DQSG().decode(chained)
    nested = NDQSG(seed_schedule="chain", chain_draws=7)
    payload = nested.encode(x, StreamKey()).payload
    with pytest.raises(PayloadMismatchError):
        NDQSG().decode(payload, side=x)
    # side information = x: the fine dithered quantizer's bound, Delta1/2 = sigma/(2 L1)
    bound = float(x.abs().max()) / (2 * nested.L1) * (1 + 1e-5)
    assert float((nested.decode(payload, side=x) - x).abs().max()) <= bound


@pytest.mark.parametrize("codec", [DQSG, NDQSG])
@pytest.mark.parametrize("bucket_size", [None, 100])
def test_chain_payloads_are_the_same_on_the_fused_kernels_and_torch_ops(
    codec: type[DQSG] | type[NDQSG], bucket_size: int | None
) -> None:
    """The chained seed reaches the CPU kernels and the torch operations (other devices'
    path, forced here on the CPU) alike: the same payload bytes and decoded bits."""
    x = torch.randn(1003, generator=torch.Generator().manual_seed(4))
    y = x + 0.05 * torch.randn(1003, generator=torch.Generator().manual_seed(5))
    side = y if codec is NDQSG else None
    comp = codec(bucket_size=bucket_size, seed_schedule="chain", chain_draws=FC_DRAWS)
    keys = [StreamKey(2, 1, step, 3) for step in (0, 5)]
    fused = [comp.encode(x, key).payload for key in keys]
    fused_out = [comp.decode(p, side=side) for p in fused]
    with forced_torch_ops():
        ops = [comp.encode(x, key).payload for key in keys]
        ops_out = [comp.decode(p, side=side) for p in fused]
    assert fused[0] != fused[1]  # the two steps' chain seeds differ
    assert fused == ops
    for a, b in zip(fused_out, ops_out, strict=True):
        assert a.view(torch.int32).equal(b.view(torch.int32))
