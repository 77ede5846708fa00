"""ring_allreduce: a ring's bytes (2(P-1)/P of one payload), the same bits on every rank and
in real processes, unbiased with the variance its docstring gives, a flag-down rank handled,
error feedback as allreduce's."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor
from gradzip.keys import StreamKey
from gradzip.schemes import make_scheme
from gradzip.schemes._pipelined_ring import HopCode

if TYPE_CHECKING:
    from tests.conftest import RunSimulatedAndProcesses

GRID_CODECS = ["dqsg", "qsgd", "terngrad", "lpc"]


def example(name: str) -> Compressor:
    cls = gradzip.get(name)
    return cls(**cls.example_params)


def bytes_per_rank(spec: str, name: str, world_size: int, n: int) -> int:
    def run(t: Transport) -> int:
        scheme = make_scheme(spec, example(name), run_seed=0)
        scheme.reduce(t, torch.randn(n, generator=torch.Generator().manual_seed(t.rank)), 0, 0)
        return t.meter.total(step=0).sent

    return max(run_local(world_size, run))


@pytest.mark.parametrize("name", GRID_CODECS)
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_bytes_per_rank_stay_within_a_tenth_of_a_ring_of_one_payload(
    name: str, world_size: int
) -> None:
    n = 1 << 16
    payload = len(example(name).encode(torch.randn(n)).payload)
    ring = 2 * (world_size - 1) / world_size * payload
    sent = bytes_per_rank("ring_allreduce[chunk_values=8192]", name, world_size, n)
    assert 0.9 * ring < sent <= 1.1 * ring


def reduce_twice(transport: Transport, spec: str, name: str, ef: bool) -> list[bytes]:
    """Two steps of ``spec`` on rank-dependent gradients; the means as bytes (module level:
    the gloo processes import it)."""
    scheme = make_scheme(spec, example(name), run_seed=4, error_feedback=ef)
    out = []
    for step in range(2):
        gen = torch.Generator().manual_seed(10 * step + transport.rank)
        g = torch.randn(3001, generator=gen) * (1 + transport.rank)
        out.append(scheme.reduce(transport, g, step, 0).numpy().tobytes())
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_chunked_pipeline_gives_the_same_bits_in_processes_as_in_threads(
    simulated_and_processes: RunSimulatedAndProcesses,
) -> None:
    # 3001 values in chunks of 100: several chunks per slice in flight on the worker thread
    runs = simulated_and_processes(
        3, reduce_twice, "ring_allreduce[chunk_values=100]", "dqsg", True
    )
    for rank in range(3):
        assert runs.processes[rank] == runs.simulated[rank] == runs.simulated[0]


@pytest.mark.parametrize("ranks", [2, 5])
def test_a_re_quantized_partial_sum_is_unbiased_with_the_rounding_variance(ranks: int) -> None:
    """``q = floor(S L / (m top) + u)`` decodes to ``S`` on average, with variance
    ``f (1 - f) unit^2`` per value (``f`` the fractional part of ``S / unit``); tolerance 5
    standard deviations of the mean of ``n`` values."""
    n, top, bits = 50_000, 2, 2
    code = HopCode(top, bits, ranks)
    sums = torch.rand(n, generator=torch.Generator().manual_seed(ranks)) * (ranks * top)
    key = StreamKey(0, 1, 2, 3, 4)
    decoded = code.decode(code.encode(sums, key), n, key).double()
    err = decoded - sums.double()
    frac = torch.frac(sums.double() / code.unit)
    var = frac * (1 - frac) * code.unit**2
    assert float(err.abs().max()) < code.unit
    assert abs(float(err.mean())) < 5 * math.sqrt(float(var.mean()) / n)
    # E[err^2] = mean variance; the squared errors are bounded by unit^2
    assert abs(float((err * err).mean()) - float(var.mean())) < 5 * code.unit**2 / math.sqrt(n)


def test_hop_codes_re_quantize_only_when_the_sum_outgrows_the_width() -> None:
    assert HopCode(top=2, bits=2, ranks=1).exact
    assert not HopCode(top=2, bits=2, ranks=2).exact
    assert HopCode(top=2, bits=2, ranks=2).unit == pytest.approx(4 / 3)


@pytest.mark.parametrize("world_size", [2, 4])
def test_mean_is_unbiased_with_the_variance_of_its_docstring(world_size: int) -> None:
    """DQSG M=1 (codes 0..2, 2 bits, L = 3) on a common scale ``sigma``: the mean's error per
    coordinate has variance ``Delta^2 (1/(12 P) + e)`` with ``Delta = sigma`` (one level) and
    ``0 <= e <= (2/3)^2 / (4 P^2) sum_{m=2..P} m^2`` from the re-quantized partial sums (their
    rounding variance ``f (1-f) unit^2`` lies between 0 and ``unit^2 / 4``). Tolerances: 5
    standard deviations of a mean of ``n`` independent coordinates (the fourth moment bounded by
    ``(max error)^2 x variance``)."""
    n = 60_000

    def grad(rank: int) -> torch.Tensor:
        return torch.rand(n, generator=torch.Generator().manual_seed(5 + rank)).sub_(0.5) * (
            1 + rank
        )

    def run(t: Transport) -> torch.Tensor:
        scheme = make_scheme(
            "ring_allreduce[chunk_values=5000]",
            gradzip.create("dqsg", M=1, bucket_size=None),
            run_seed=7,
        )
        return scheme.reduce(t, grad(t.rank), 3, 0)

    means = run_local(world_size, run)
    assert all(torch.equal(m, means[0]) for m in means)
    truth = sum(grad(r).double() for r in range(world_size)) / world_size
    err = means[0].double() - truth
    sigma = max(float(grad(r).abs().max()) for r in range(world_size))
    p = world_size
    floor = sigma**2 / (12 * p)
    extra = sigma**2 * (2 / 3) ** 2 / (4 * p * p) * sum(m * m for m in range(2, p + 1))
    worst = float(err.abs().max())
    tol = 5 * math.sqrt(worst**2 * (floor + extra) / n)
    mse = float((err * err).mean())
    assert floor - tol < mse < floor + extra + tol
    assert mse > floor + 0.2 * extra  # the re-quantization is really there
    assert abs(float(err.mean())) < 5 * math.sqrt((floor + extra) / n)
    # no bias that follows the value either
    assert abs(float((err * truth.sign()).mean())) < 5 * math.sqrt((floor + extra) / n)


def test_a_flag_down_rank_is_named_on_every_rank_and_no_residual_changes() -> None:
    def run(t: Transport) -> tuple[object, bool]:
        scheme = make_scheme("ring_allreduce", example("dqsg"), run_seed=1, error_feedback=True)
        g = torch.randn(500, generator=torch.Generator().manual_seed(t.rank))
        scheme.reduce(t, g, 0, 0)
        before = scheme.snapshot()
        bad = g.clone()
        if t.rank == 2:
            bad[7] = float("nan")
        result = scheme.reduce_if_all_finite(t, bad, 1, 0, bool(torch.isfinite(bad).all()))
        after = scheme.snapshot()
        unchanged = all(
            torch.equal(before["worker"][slot], after["worker"][slot]) for slot in before["worker"]
        )
        return result, unchanged

    for result, unchanged in run_local(4, run):
        assert result == [2]
        assert unchanged


@pytest.mark.parametrize("name", ["dqsg", "terngrad"])
def test_error_feedback_keeps_the_residual_allreduce_keeps(name: str) -> None:
    """Same common scale, symbols and own key as ``allreduce``: after a step the residual of
    this rank's own quantization is the same bits (the re-quantization of partial sums is
    shared and unbiased, not fed back)."""

    def run(t: Transport, spec: str) -> dict[object, torch.Tensor]:
        scheme = make_scheme(spec, example(name), run_seed=2, error_feedback=True)
        g = torch.randn(2000, generator=torch.Generator().manual_seed(t.rank))
        scheme.reduce(t, g, 0, 0)
        return scheme.snapshot()["worker"]

    ours = run_local(3, lambda t: run(t, "ring_allreduce"))
    theirs = run_local(3, lambda t: run(t, "allreduce"))
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys() and a
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert any(bool(a[k].abs().sum() > 0) for k in a)


def test_a_bad_chunk_size_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="chunk_values"):
        make_scheme("ring_allreduce[chunk_values=0]", example("dqsg"))
