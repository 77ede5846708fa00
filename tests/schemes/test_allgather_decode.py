"""Scheme (a): all-gather the payloads, decode all of them in rank order, average."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError, KeyMismatchError
from gradzip.feedback import ErrorFeedback
from gradzip.keys import StreamKey
from gradzip.schemes import AllGatherDecode

if TYPE_CHECKING:
    from tests.conftest import RunSimulatedAndProcesses

RUN_SEED = 11


def gradient(rank: int, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(33, 17, generator=gen)


def averaged(transport: Transport, name: str, steps: int = 2) -> list[np.ndarray]:
    """A module-level function, so spawned processes can import it."""
    cls = gradzip.get(name)
    scheme = AllGatherDecode(cls(**cls.example_params), run_seed=RUN_SEED)
    return [
        scheme.reduce(transport, gradient(transport.rank, step), step).numpy()
        for step in range(steps)
    ]


@pytest.mark.parametrize("name", ["identity", "dqsg", "qsgd", "terngrad", "onebit", "topk"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_every_rank_holds_the_same_mean_of_the_decoded_payloads(name: str, world_size: int) -> None:
    results = run_local(world_size, lambda t: averaged(t, name))
    cls = gradzip.get(name)
    comp = cls(**cls.example_params)
    for step in range(2):
        expected = torch.zeros(33, 17)
        for rank in range(world_size):
            key = StreamKey(RUN_SEED, rank, step, 0)
            expected += comp.decode(comp.encode(gradient(rank, step), key).payload)
        expected /= world_size
        for rank in range(world_size):
            assert results[rank][step].tobytes() == expected.numpy().tobytes()
    if name == "identity":
        exact = sum(gradient(r, 1) for r in range(world_size)) / world_size
        assert np.array_equal(results[0][1], exact.numpy())


@pytest.mark.parametrize("name", ["onebit", "topk", "dqsg"])
def test_own_reconstruction_stands_in_for_decoding_the_own_payload(name: str) -> None:
    """With error feedback each rank adds the reconstruction its encoding made instead of
    decoding its own payload; the mean must still be the rank-ordered sum of every decoded
    payload, bit for bit, on every rank (rank 0 starts the sum, the others add to it)."""
    world_size, steps = 3, 3
    cls = gradzip.get(name)

    def run(transport: Transport) -> list[bytes]:
        scheme = AllGatherDecode(cls(**cls.example_params), run_seed=RUN_SEED, error_feedback=True)
        out = []
        for step in range(steps):
            g = gradient(transport.rank, step)
            mean = scheme.reduce_if_all_finite(transport, g, step, 0, True)
            assert isinstance(mean, torch.Tensor)
            out.append(mean.numpy().tobytes())
        return out

    results = run_local(world_size, run)
    comp = cls(**cls.example_params)
    feedback = [ErrorFeedback(comp) for _ in range(world_size)]
    for step in range(steps):
        decoded = []
        for rank in range(world_size):
            key = StreamKey(RUN_SEED, rank, step, 0)
            payload = feedback[rank].encode(gradient(rank, step), key).payload
            decoded.append(comp.decode(payload, expected_key=key, shape=torch.Size((33, 17))))
        expected = decoded[0].clone()
        for values in decoded[1:]:
            expected = expected + values
        expected /= world_size
        for rank in range(world_size):
            assert results[rank][step] == expected.numpy().tobytes(), (rank, step)


@pytest.mark.parametrize(("name", "kept"), [("dqsg", True), ("qsgd", True), ("onebit", False)])
def test_error_feedback_keeps_the_reconstruction_unless_decoding_is_cheap(
    name: str, kept: bool
) -> None:
    """A codec that decodes cheaply (one-bit: 1/32 of the bytes, no randomness) re-decodes its
    own payload instead of writing and re-reading a dense reconstruction; the others keep it."""
    cls = gradzip.get(name)
    assert cls.decodes_cheaply is not kept
    scheme = AllGatherDecode(cls(**cls.example_params), run_seed=RUN_SEED, error_feedback=True)
    outgoing = scheme.encode_flagged(0, gradient(0, 0), 0, 0)
    assert outgoing.finite and (outgoing.own is not None) == kept


def test_bytes_per_rank_are_the_other_payloads() -> None:
    def run(transport: Transport) -> tuple[int, int, int]:
        scheme = AllGatherDecode(gradzip.create("dqsg"))
        g = gradient(transport.rank, 0)
        own = len(scheme.compressor.encode(g, scheme.key(transport.rank, 0, 0)).payload)
        scheme.reduce(transport, g, step=0)
        total = transport.meter.total(step=0)
        return own, total.sent, total.received

    out = run_local(4, run)
    own = out[0][0]
    assert all(o == own for o, _, _ in out)  # same shape, same size: equal payloads
    for _, sent, received in out:
        assert sent == received == 3 * (own + 8)


def test_a_payload_of_another_step_is_rejected() -> None:
    def run(transport: Transport) -> torch.Tensor:
        scheme = AllGatherDecode(gradzip.create("dqsg"))
        step = 5 if transport.rank == 1 else 4  # rank 1 is out of step
        return scheme.reduce(transport, gradient(transport.rank, 4), step)

    with pytest.raises(GradzipError, match="KeyMismatchError") as info:
        run_local(3, run)
    assert isinstance(info.value.__cause__, KeyMismatchError)


def test_side_information_codecs_are_refused() -> None:
    with pytest.raises(ValueError, match="side information"):
        AllGatherDecode(gradzip.create("ndqsg"))


@pytest.mark.distributed
def test_processes_match_simulation_bitwise(
    simulated_and_processes: RunSimulatedAndProcesses,
) -> None:
    runs = simulated_and_processes(2, averaged, "dqsg")
    real, simulated = runs.processes, runs.simulated
    for rank in range(2):
        for a, b in zip(real[rank], simulated[rank], strict=True):
            assert a.tobytes() == b.tobytes()
