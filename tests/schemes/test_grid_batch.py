"""The integer-sum schemes reduce a batch of tensors (a DDP bucket's parameters) with one scale
agreement carrying every rank's finite flag, and ``allreduce`` with one code ring: the same
means and residuals as one by one, fewer messages, and a flag-down rank stops every rank before
any code is sent, with nothing updated."""

from __future__ import annotations

import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.schemes import make_scheme
from gradzip.schemes._messages import pack_floats
from gradzip.schemes.base import Scheme

#: shapes of a small model's parameters (an empty one too: its mean is zeros, nothing sent)
SHAPES = [(30, 20), (30,), (10, 30), (10,), (0,), (1, 10)]
INDICES = [3, 4, 5, 6, 7, 8]
SCHEMES = ["allreduce", "ring_allreduce[chunk_values=64]"]
STEPS = 2


def qsgd() -> gradzip.Compressor:
    return gradzip.create("qsgd", s=4)


#: compressors beside the registered examples: QSGD with many levels (int32 symbols, the
#: float64 rounding path) and small buckets (several per tensor), and QSGD with l2 scales (not
#: the max-abs statistic: quantized tensor by tensor)
CONFIGURED = {
    "qsgd-wide": lambda: gradzip.create("qsgd", s=200, bucket_size=64),
    "qsgd-l2": lambda: gradzip.create("qsgd", s=4, norm="l2", bucket_size=64),
}


def example(name: str) -> gradzip.Compressor:
    if name in CONFIGURED:
        return CONFIGURED[name]()
    cls = gradzip.get(name)
    return cls(**cls.example_params)


def grads(rank: int, step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(shape, generator=gen) * (1 + rank) for shape in SHAPES]


def one_by_one(scheme: Scheme, t: Transport, tensors: list[torch.Tensor], step: int) -> list:
    return [scheme.reduce(t, g, step, i) for g, i in zip(tensors, INDICES, strict=True)]


def batched(scheme: Scheme, t: Transport, tensors: list[torch.Tensor], step: int) -> list:
    means, down = scheme.reduce_many_if_all_finite(t, tensors, INDICES, step, True)
    assert down == []
    return means


def run(spec: str, ef: bool, batch: bool, world_size: int, codec: str = "qsgd") -> list[dict]:
    """Two steps on every rank: the means, the residuals after them, messages and bytes sent."""

    def body(t: Transport) -> dict:
        compressor = qsgd() if codec == "qsgd" else example(codec)
        scheme = make_scheme(spec, compressor, run_seed=5, error_feedback=ef)
        reduce = batched if batch else one_by_one
        means = [reduce(scheme, t, grads(t.rank, step), step) for step in range(STEPS)]
        residuals = (
            [
                scheme.feedback["worker"].residual(i)
                for i, s in zip(INDICES, SHAPES, strict=True)
                if s != (0,)
            ]
            if ef
            else []
        )
        traffic = t.meter.total(step=0)
        return {
            "means": means,
            "residuals": residuals,
            "messages": traffic.messages,
            "sent": traffic.sent,
        }

    return run_local(world_size, body)


def assert_bit_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.numpy().tobytes() == y.numpy().tobytes()


@pytest.mark.parametrize("spec", SCHEMES)
@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("ef", [False, True], ids=["plain", "feedback"])
def test_a_batch_gives_the_bits_of_one_by_one_in_fewer_messages(
    spec: str, world_size: int, ef: bool
) -> None:
    """``allreduce``'s sums are exact and ``ring_allreduce`` keeps a code ring per tensor, so
    the means and the residuals are those of one by one, bit for bit, on every rank."""
    alone = run(spec, ef, False, world_size)
    batch = run(spec, ef, True, world_size)
    for rank in range(world_size):
        for step in range(STEPS):
            assert_bit_equal(batch[rank]["means"][step], alone[rank]["means"][step])
            assert_bit_equal(batch[rank]["means"][step], batch[0]["means"][step])
        assert_bit_equal(batch[rank]["residuals"], alone[rank]["residuals"])
        assert any(bool(r.abs().sum() > 0) for r in batch[rank]["residuals"]) or not ef
    live = sum(1 for s in SHAPES if s != (0,))
    # one by one: each live tensor pays a scale agreement (allreduce: P-1 sends of an
    # all-gather; ring_allreduce: a max ring of 2(P-1)); the batch pays one
    scale_sends = world_size - 1 if spec == "allreduce" else 2 * (world_size - 1)
    saved = (live - 1) * scale_sends
    if spec == "allreduce":  # and one code ring of 2(P-1) sends instead of one per tensor
        saved += (live - 1) * 2 * (world_size - 1)
    for rank in range(world_size):
        assert batch[rank]["messages"] == alone[rank]["messages"] - saved
        assert batch[rank]["sent"] < alone[rank]["sent"]


@pytest.mark.parametrize("codec", ["dqsg", "terngrad", "lpc", "hou", "qsgd-wide", "qsgd-l2"])
@pytest.mark.parametrize("spec", ["allreduce", "ps_intsum"])
def test_every_grid_codec_batches_bit_for_bit(codec: str, spec: str) -> None:
    """The other grid codecs' statistics (per bucket, one scalar) and offsets (DQSG's dithers)
    split back to each tensor as its own agreement gave them; with ``allreduce`` the symmetric
    grids (TernGrad, Hou, QSGD with max scales) go through the batched kernels
    (:func:`test_the_batched_kernels_serve_the_symmetric_grids_of_exact_sums`)."""
    alone = run(spec, True, False, 3, codec)
    batch = run(spec, True, True, 3, codec)
    for rank in range(3):
        for step in range(STEPS):
            assert_bit_equal(batch[rank]["means"][step], alone[rank]["means"][step])
        assert_bit_equal(batch[rank]["residuals"], alone[rank]["residuals"])


@pytest.mark.parametrize(
    ("codec", "spec", "segmented"),
    [
        ("qsgd", "allreduce", True),
        ("terngrad", "allreduce", True),
        ("hou", "allreduce", True),
        ("qsgd-wide", "allreduce", True),
        ("qsgd-l2", "allreduce", False),  # l2 scales: not the max-abs statistic
        ("dqsg", "allreduce", False),  # subtractive dithers: its own symbols
        ("lpc", "allreduce", False),
        ("qsgd", "ring_allreduce", False),  # a float ring per tensor: not an exact batch sum
        ("qsgd", "ps_intsum", False),
    ],
)
def test_the_batched_kernels_serve_the_symmetric_grids_of_exact_sums(
    codec: str, spec: str, segmented: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which batches take the kernels of :mod:`gradzip.kernels.grid_segments` (so the bit
    tests above compare them with one by one): counted at the call, once per step and rank."""
    import gradzip.schemes._grid_batch as grid_batch

    calls: list[int] = []
    real = grid_batch.encode_segments

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(grid_batch, "encode_segments", counted)
    run(spec, True, True, 2, codec)
    assert len(calls) == (2 * STEPS if segmented else 0)


def test_a_batch_mean_of_the_ring_is_unbiased() -> None:
    """The batch's means over many steps approach the true mean within the variance of QSGD's
    sum (``allreduce``'s docstring: ``sum_p V_p / P^2`` per value, ``V_p <= min(n/s^2,
    sqrt(n)/s) * max_p ||g_p||^2`` for a bucket of ``n`` values), at five standard errors."""
    world_size, steps = 3, 40

    def body(t: Transport) -> list[torch.Tensor]:
        scheme = make_scheme("ring_allreduce[chunk_values=64]", qsgd(), run_seed=9)
        fixed = grads(t.rank, 0)
        total = [torch.zeros(g.shape) for g in fixed]
        for step in range(steps):
            means, down = scheme.reduce_many_if_all_finite(t, fixed, INDICES, step, True)
            assert down == []
            for acc, mean in zip(total, means, strict=True):
                acc += mean
        return [acc / steps for acc in total]

    runs = run_local(world_size, body)
    truth = [sum(grads(r, 0)[i] for r in range(world_size)) / world_size for i in range(6)]
    for rank in range(world_size):
        assert_bit_equal(runs[rank], runs[0])
    s = 4
    for i, shape in enumerate(SHAPES):
        n = int(torch.Size(shape).numel())
        if n == 0:
            continue
        norms = max(float(grads(r, 0)[i].norm()) ** 2 for r in range(world_size))
        per_value = min(n / s**2, n**0.5 / s) * norms / n  # a rank's variance per value
        var_mean = world_size * per_value / world_size**2 / steps
        err = (runs[0][i] - truth[i]).reshape(-1)
        # the mean of n independent errors, and every single one
        assert abs(float(err.mean())) <= 5 * (var_mean / n) ** 0.5
        assert float(err.abs().max()) <= 6 * var_mean**0.5


@pytest.mark.parametrize("spec", SCHEMES)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_a_flag_down_rank_stops_every_rank_before_any_code(spec: str, world_size: int) -> None:
    """Rank 1's flag is down (``finite=False``) in one run, a NaN in its last tensor in another:
    every rank gets ``[1]``, only the scale agreement was sent, no residual changed."""

    def body(t: Transport, how: str) -> tuple:
        scheme = make_scheme(spec, qsgd(), run_seed=5, error_feedback=True)
        batched(scheme, t, grads(t.rank, 0), 0)  # residuals to keep
        before = scheme.state_dict()
        tensors, finite = grads(t.rank, 1), True
        if t.rank == 1:
            if how == "flag":
                finite = False
            else:
                tensors[-1][0, 3] = float("nan")
        means, down = scheme.reduce_many_if_all_finite(t, tensors, INDICES, 1, finite)
        after = scheme.state_dict()
        same = all(
            bool(torch.equal(a, b))
            for a, b in zip(
                before["feedback"]["worker"]["residual"],
                after["feedback"]["worker"]["residual"],
                strict=True,
            )
        )
        return means, down, same, t.meter.total(step=1).messages

    for how in ("flag", "nan"):
        runs = run_local(world_size, lambda t, how=how: body(t, how))
        scale_sends = world_size - 1 if spec == "allreduce" else 2 * (world_size - 1)
        for means, down, same, messages in runs:
            assert means == [] and down == [1] and same
            assert messages == scale_sends


def test_a_batch_refuses_mismatched_indices() -> None:
    def body(t: Transport) -> str:
        scheme = make_scheme("allreduce", qsgd())
        with pytest.raises(ValueError, match="one index per tensor"):
            scheme.reduce_many_if_all_finite(t, [torch.ones(3)], [0, 1], 0, True)
        return "ok"

    assert run_local(2, body) == ["ok", "ok"]


def test_allreduce_gathers_in_collectives_of_equal_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scale agreement and the all-gather half of the code ring name a slot size, the same
    on every rank and at least every rank's message, so a transport with an all-gather of
    equal slots (gloo, NCCL) moves each in one collective, not P - 1 rounds through Python
    (P = 4, a ResNet-20 DDP step on two cores over localhost gloo: 1.41x fp32's step before,
    1.34x after)."""
    asked: list[tuple[int, int | None]] = []
    original = Transport.all_gather_bytes

    def spy(self: Transport, payload, collective="all_gather", *, expected_size=None):  # type: ignore[no-untyped-def]
        asked.append((len(payload), expected_size))
        return original(self, payload, collective, expected_size=expected_size)

    monkeypatch.setattr(Transport, "all_gather_bytes", spy)
    run("allreduce", ef=True, batch=True, world_size=4)
    run("allreduce", ef=False, batch=False, world_size=3)
    assert len(asked) > 8
    assert all(expected is not None and size <= expected for size, expected in asked)
    # slices of unequal length: some messages are shorter than their slot
    assert any(expected is not None and size < expected for size, expected in asked)


def test_the_scale_slot_holds_every_ranks_message_past_128_ranks() -> None:
    """The agreement's slot is the largest rank's message: from rank 128 on, the rank's varint
    in the key takes a byte more (a slot sized by rank 0's message would be too small there,
    and the ranks would disagree on the slot)."""
    scheme = make_scheme("allreduce", qsgd(), run_seed=5)
    statistic = torch.ones(3)
    world = 200
    messages = [pack_floats(statistic, scheme.key(r, 7, 2)) for r in range(world)]
    assert len(messages[-1]) > len(messages[0])
    slots: list[int | None] = []

    class Gatherer:
        rank, world_size = 0, world

        def all_gather_bytes(self, payload, collective="all_gather", *, expected_size=None):  # type: ignore[no-untyped-def]
            slots.append(expected_size)
            return messages

    agreed = scheme._agree(Gatherer(), statistic, 7, 2)  # type: ignore[arg-type]
    assert torch.equal(agreed, statistic)
    assert slots == [max(len(m) for m in messages)]


def bucket_views(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``tensors`` copied end to end into one flat buffer and returned as its views (how DDP
    hands a bucket's gradients over), with the buffer."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    out, at = [], 0
    for t in tensors:
        out.append(flat.narrow(0, at, t.numel()).view(t.shape))
        at += t.numel()
    return flat, out


@pytest.mark.parametrize("ef", [False, True], ids=["plain", "feedback"])
def test_a_buckets_views_are_quantized_in_place_with_the_same_bits(
    ef: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gradients that are views of one bucket (and, with error feedback, the compensated
    values) are quantized where they lie, not copied end to end first: the means and residuals
    are those of separate tensors, bit for bit, and the bucket is left as it was."""
    import gradzip.schemes._grid_batch as grid_batch

    joined: list[bool] = []
    real = grid_batch.adjacent_flat

    def watched(xs: list[torch.Tensor]) -> torch.Tensor | None:
        got = real(xs)
        joined.append(got is not None)
        return got

    monkeypatch.setattr(grid_batch, "adjacent_flat", watched)

    def body(as_views: bool) -> list[dict]:
        def rank_body(t: Transport) -> dict:
            scheme = make_scheme("allreduce", qsgd(), run_seed=5, error_feedback=ef)
            means, residuals = [], []
            for step in range(STEPS):
                tensors = grads(t.rank, step)
                if as_views:
                    flat, tensors = bucket_views(tensors)
                    before = flat.clone()
                means.append(batched(scheme, t, tensors, step))
                if as_views:
                    assert torch.equal(flat, before)
            if ef:
                residuals = [
                    scheme.feedback["worker"].residual(i)
                    for i, s in zip(INDICES, SHAPES, strict=True)
                    if s != (0,)
                ]
            return {"means": means, "residuals": residuals}

        return run_local(2, rank_body)

    separate = body(False)
    seen_separate = list(joined)
    joined.clear()
    together = body(True)
    for rank in range(2):
        for step in range(STEPS):
            assert_bit_equal(together[rank]["means"][step], separate[rank]["means"][step])
        assert_bit_equal(together[rank]["residuals"], separate[rank]["residuals"])
    # views (or error feedback's compensated values) are joined without a copy; separate
    # gradients without error feedback are not adjacent and are copied
    assert joined and all(joined)
    assert all(seen_separate) == ef
