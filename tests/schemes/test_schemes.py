"""Every aggregation scheme: identical results on every rank, exact with the identity codec,
the maths of the shared-scale and re-quantizing schemes, bytes per rank versus P."""

from __future__ import annotations

import math

import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor
from gradzip.compressors.buckets import papers_scales
from gradzip.errors import GradzipError, KeyMismatchError
from gradzip.schemes import VARIANTS, SchemeSpec, make_scheme

COMPRESSORS = ["identity", "dqsg", "qsgd", "terngrad", "lpc", "onebit", "topk", "ndqsg"]


def compressor(name: str) -> Compressor:
    cls = gradzip.get(name)
    return cls(**cls.example_params)


def pairs() -> list[tuple[str, str]]:
    return [
        (variant, name)
        for variant in VARIANTS
        for name in COMPRESSORS
        if gradzip.schemes.scheme_accepts(variant, compressor(name))
    ]


def gradient(rank: int, step: int, shape: tuple[int, ...] = (13, 7)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(shape, generator=gen) * (1 + rank)


def reduce_steps(
    transport: Transport, variant: str, name: str, steps: int = 2, ef: bool = False
) -> list[torch.Tensor]:
    scheme = make_scheme(variant, compressor(name), run_seed=3, error_feedback=ef)
    return [scheme.reduce(transport, gradient(transport.rank, s), s, 0) for s in range(steps)]


def test_every_compressor_has_several_schemes() -> None:
    found = pairs()
    assert len(found) >= 40
    assert {v for v, _ in found} == set(VARIANTS)


@pytest.mark.parametrize(("variant", "name"), pairs())
@pytest.mark.parametrize("world_size", [1, 3])
def test_every_rank_holds_the_same_average(variant: str, name: str, world_size: int) -> None:
    results = run_local(world_size, lambda t: reduce_steps(t, variant, name))
    for rank in range(1, world_size):
        for step in range(2):
            assert torch.equal(results[rank][step], results[0][step])
    assert results[0][0].shape == (13, 7)
    assert results[0][0].dtype == torch.float32


def exact(variant: str) -> bool:
    """Whether the variant's scheme gives the exact mean with a lossless codec."""
    return SchemeSpec.parse(variant).scheme_class.exact_with_lossless_codec


@pytest.mark.parametrize("variant", [v for v, n in pairs() if n == "identity" and exact(v)])
@pytest.mark.parametrize("world_size", [2, 3])
def test_identity_gives_the_exact_mean(variant: str, world_size: int) -> None:
    results = run_local(world_size, lambda t: reduce_steps(t, variant, "identity"))
    exact = sum(gradient(r, 1) for r in range(world_size)) / world_size
    if world_size == 2:  # (a + b) / 2 has one rounding whatever the order
        assert torch.equal(results[0][1], exact)
    else:
        torch.testing.assert_close(results[0][1], exact, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["dqsg", "qsgd", "onebit", "topk"])
def test_fp32_parameter_server_equals_allgather_decode(name: str) -> None:
    """Same decodes, same order, same arithmetic: the server only moves where it happens."""
    ps = run_local(3, lambda t: reduce_steps(t, "ps[fp32]", name))
    ag = run_local(3, lambda t: reduce_steps(t, "allgather", name))
    assert all(torch.equal(a, b) for a, b in zip(ps[1], ag[1], strict=True))


@pytest.mark.parametrize("name", ["dqsg", "lpc", "terngrad"])
def test_server_integer_sum_equals_the_ring_integer_sum(name: str) -> None:
    server = run_local(3, lambda t: reduce_steps(t, "ps_intsum[sum]", name))
    ring = run_local(3, lambda t: reduce_steps(t, "allreduce", name))
    assert all(torch.equal(a, b) for a, b in zip(server[0], ring[0], strict=True))


@pytest.mark.parametrize("variant", ["allreduce", "ps_intsum[sum]"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_shared_scale_dqsg_error_is_uniform_over_the_common_cell(
    variant: str, world_size: int
) -> None:
    """DQSG on the common scale ``sigma = max_p max|g_p|``: each rank's error is
    ``U[-sigma/2M, sigma/2M]``, independent across ranks, so the mean's error is bounded by
    ``sigma/(2M)`` and has variance ``sigma^2/(12 M^2 P)``. Tolerance: 5 standard deviations of
    the sample variance over n coordinates (moments of a mean of P uniforms)."""
    n, M = 40_000, 2

    def grad(rank: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(77 + rank)
        return torch.rand(n, generator=gen).sub_(0.5) * (2.0 + rank)  # ranks differ in range

    def run(t: Transport) -> torch.Tensor:
        scheme = make_scheme(variant, gradzip.create("dqsg", M=M), run_seed=9)
        return scheme.reduce(t, grad(t.rank), 4, 1)

    mean = run_local(world_size, run)[0].double()
    truth = sum(grad(r).double() for r in range(world_size)) / world_size
    sigma = max(float(grad(r).abs().max()) for r in range(world_size))
    a = sigma / (2 * M)
    err = mean - truth
    assert float(err.abs().max()) <= a * (1 + 1e-5)
    e2 = a * a / (3 * world_size)
    e4 = (world_size * a**4 / 5 + 3 * world_size * (world_size - 1) * (a * a / 3) ** 2) / (
        world_size**4
    )
    tol = 5 * math.sqrt((e4 - e2 * e2) / n)
    assert abs(float((err * err).mean()) - e2) < tol
    assert abs(float(err.mean())) < 5 * math.sqrt(e2 / n)


def test_requantized_lpc_downlink_is_unbiased_and_on_the_common_grid() -> None:
    """Scheme (c): the server's stochastic rounding of the mean level is unbiased; every
    output is an integer multiple of the common step ``delta = max ||u||_inf / s``."""
    n, P = 30_000, 3

    def grad(rank: int) -> torch.Tensor:
        return torch.rand(n, generator=torch.Generator().manual_seed(5 + rank)).sub_(0.5)

    def run(t: Transport) -> torch.Tensor:
        scheme = make_scheme("ps_intsum[requantize]", gradzip.create("lpc", b=3), run_seed=1)
        return scheme.reduce(t, grad(t.rank), 0, 0)

    out = run_local(P, run)[0].double()
    truth = sum(grad(r).double() for r in range(P)) / P
    delta = float(torch.tensor(max(float(grad(r).abs().max()) for r in range(P)) / 3))
    levels = out / delta
    assert torch.allclose(levels, levels.round(), atol=1e-4)
    assert float(levels.abs().max()) <= 3
    # per coordinate: two stochastic roundings (<= delta^2/4 each, the first averaged over P)
    bound = delta**2 / 4 * (1 / P + 1)
    assert abs(float((out - truth).mean())) < 5 * math.sqrt(bound / n)


def test_ring_with_error_feedback_delivers_what_compression_dropped() -> None:
    """A constant gradient through onebit: without error feedback the bias stays; with both
    ring buffers the time-average converges to the true mean like 1/T."""
    steps, P = 40, 3

    def run(t: Transport, ef: bool) -> torch.Tensor:
        scheme = make_scheme("ring", gradzip.create("onebit"), run_seed=2, error_feedback=ef)
        g = gradient(t.rank, 0, (12, 5))
        return sum(scheme.reduce(t, g, s, 0) for s in range(steps)) / steps

    truth = sum(gradient(r, 0, (12, 5)) for r in range(P)) / P
    with_ef = run_local(P, lambda t: run(t, True))[0]
    without = run_local(P, lambda t: run(t, False))[0]
    assert float((with_ef - truth).abs().max()) < 0.5 * float((without - truth).abs().max())
    assert float((with_ef - truth).abs().max()) < 20 * float(truth.abs().max()) / steps


def bytes_sent(variant: str, name: str, world_size: int, n: int) -> float:
    def run(t: Transport) -> int:
        # one scale per tensor: the byte models below count symbols, not bucket scales
        codec = gradzip.get(name)(**papers_scales(name, gradzip.get(name).example_params))
        scheme = make_scheme(variant, codec, run_seed=0)
        scheme.reduce(t, torch.randn(n, generator=torch.Generator().manual_seed(t.rank)), 0, 0)
        return t.meter.total(step=0).sent

    return sum(run_local(world_size, run)) / world_size


def test_allreduce_bytes_per_rank_stay_flat_while_allgather_grows() -> None:
    n = 1 << 15
    flat = [bytes_sent("allreduce", "dqsg", p, n) for p in (2, 4, 8)]
    grows = [bytes_sent("allgather", "dqsg", p, n) for p in (2, 4, 8)]
    # P - 1 slices of n/P symbols each way (DQSG M=1: values 0..2 per rank): the reduce-scatter
    # sends one rank's codes at bit_length(2) bits, the all-gather the full sums at
    # bit_length(2P)
    for p, sent in zip((2, 4, 8), flat, strict=True):
        widths = [(2).bit_length()] * (p - 1) + [(2 * p).bit_length()] * (p - 1)
        model = n / p * sum(widths) / 8
        assert model < sent < 1.05 * model + 100 * p
    # from P = 2 to 8: the share 2(P-1)/P goes 1 -> 1.75 and the mean width 2.5 -> 3.5 bits
    # (logarithmic growth); allgather sends P - 1 payloads (linear growth)
    assert flat[2] < 3.1 * flat[0]
    assert grows[2] > 6.5 * grows[0]
    assert flat[2] < 0.6 * grows[2]


def test_ring_bytes_are_about_twice_one_payload() -> None:
    n, p = 1 << 15, 4
    payload = len(gradzip.create("dqsg", M=1, bucket_size=None).encode(torch.randn(n)).payload)
    sent = bytes_sent("ring", "dqsg", p, n)
    assert 2 * (p - 1) / p * payload < sent < 1.1 * 2 * (p - 1) / p * payload + 400


def test_parameter_server_traffic_concentrates_on_the_server() -> None:
    def run(t: Transport) -> tuple[int, int]:
        scheme = make_scheme("ps[fp32]", compressor("dqsg"))
        scheme.reduce(t, torch.randn(1000), 0, 0)
        total = t.meter.total(step=0)
        return total.sent, total.received

    traffic = run_local(4, run)
    fp32_down = len(gradzip.create("identity").encode(torch.zeros(1000)).payload) + 8
    assert traffic[0][0] == 3 * fp32_down  # the server sends P - 1 fp32 means
    for sent, received in traffic[1:]:
        assert received == fp32_down and sent < fp32_down / 8


def test_nested_scheme_decodes_close_gradients_without_failures() -> None:
    """Side information close to the nested workers' gradients (spec 1.6 success condition):
    no failure, and the error of each nested worker is DQSG's with the fine step."""
    n, P = 5000, 4
    base = torch.randn(n, generator=torch.Generator().manual_seed(1))

    def grad(rank: int, spread: float) -> torch.Tensor:
        noise = torch.randn(n, generator=torch.Generator().manual_seed(100 + rank))
        return base + spread * noise

    def run(t: Transport, spread: float) -> float:
        scheme = make_scheme("nested[allgather]", gradzip.create("ndqsg"), run_seed=4, record=True)
        scheme.reduce(t, grad(t.rank, spread), 0, 0)
        return scheme.failure_rate([grad(r, spread) for r in range(P)])

    assert run_local(P, lambda t: run(t, 0.01)) == [0.0] * P
    far = run_local(P, lambda t: run(t, 3.0))
    assert len(set(far)) == 1 and 0.0 < far[0] < 1.0


def test_a_payload_of_another_run_is_rejected_by_every_scheme() -> None:
    for variant, name in [(v, "dqsg") for v in VARIANTS if not v.startswith("nested")] + [
        ("nested[allgather]", "ndqsg")
    ]:

        def run(t: Transport, variant: str = variant, name: str = name) -> torch.Tensor:
            scheme = make_scheme(variant, compressor(name), run_seed=1 + (t.rank == 1))
            return scheme.reduce(t, gradient(t.rank, 0), 0, 0)

        with pytest.raises(GradzipError) as info:
            run_local(2, run, timeout=10)
        assert isinstance(info.value.__cause__, KeyMismatchError), variant


def test_incompatible_pairs_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="integer levels"):
        make_scheme("allreduce", gradzip.create("onebit"))
    with pytest.raises(ValueError, match="side information"):
        make_scheme("ring", gradzip.create("ndqsg"))
    with pytest.raises(ValueError, match="side-information"):
        make_scheme("nested[allgather]", gradzip.create("dqsg"))
    with pytest.raises(ValueError, match="error feedback"):
        make_scheme("nested[allgather]", gradzip.create("ndqsg"), error_feedback=True)
    with pytest.raises(ValueError, match="unknown scheme 'butterfly'"):
        make_scheme("butterfly", gradzip.create("dqsg"))


@pytest.mark.parametrize("variant", ["ps[fp32]", "ps_intsum[sum]"])
def test_workers_learn_at_once_why_the_server_abandoned_a_step(variant: str) -> None:
    def run(t: Transport) -> str:
        scheme = make_scheme(variant, compressor("dqsg"), run_seed=1 + (t.rank == 1))
        try:
            scheme.reduce(t, gradient(t.rank, 0), 0, 0)
        except GradzipError as err:
            return f"{type(err).__name__}: {err}"
        return "no error"

    messages = run_local(3, run, timeout=30)  # an abort arrives long before the timeout
    assert messages[0].startswith("KeyMismatchError")
    for worker in (1, 2):
        assert messages[worker].startswith("ServerAbortError")
        assert "run_seed" in messages[worker] and "nothing was applied" in messages[worker]


@pytest.mark.parametrize(
    ("ratio", "world", "first"),
    [
        (0.3, 10, 3),
        (0.14, 50, 7),  # 0.14 * 50 == 7.000000000000001 in floating point
        (0.28, 25, 7),
        (0.56, 25, 14),
        (0.35, 10, 4),
        (0.5, 3, 2),
        (1.0, 4, 4),
        (0.01, 8, 1),
    ],
)
def test_nested_group_split_is_ceil_of_ratio_times_ranks_despite_float_noise(
    ratio: float, world: int, first: int
) -> None:
    # the documented |P1| = ceil(ratio * P) of the exact product, not of its rounded float
    from gradzip.schemes.nested import NestedScheme

    scheme = NestedScheme(gradzip.create("ndqsg"), ratio=ratio)
    assert scheme.first_group(world) == first


@pytest.mark.parametrize("world_size", [2, 3])
def test_ring_with_the_fused_feedback_step_equals_the_unfused_path(world_size: int) -> None:
    """The ring takes the owner's reconstruction from error feedback's fused onebit step
    instead of decoding its own message: means and residuals are bitwise the unfused path's."""
    from gradzip.compressors.onebit import OneBit

    class Unfused(OneBit):
        encode_with_feedback = None  # type: ignore[assignment]

    def run(t: Transport, comp: Compressor) -> list[torch.Tensor]:
        scheme = make_scheme("ring", comp, run_seed=2, error_feedback=True)
        means = [scheme.reduce(t, gradient(t.rank, s, (12, 5)), s, 0) for s in range(3)]
        buffers = [
            scheme.feedback[r].residual(0, c)
            for r in scheme.feedback
            for c in range(2)
            if (0, c) in scheme.feedback[r].snapshot()
        ]
        return means + buffers

    fused = run_local(world_size, lambda t: run(t, OneBit()))
    plain = run_local(world_size, lambda t: run(t, Unfused()))
    for a, b in zip(fused, plain, strict=True):
        assert len(a) == len(b) and len(a) > 3
        assert all(
            x.view(torch.int32).equal(y.view(torch.int32)) for x, y in zip(a, b, strict=True)
        )
