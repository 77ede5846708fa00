"""QESGD's failure handling and its bucket calibration: an overflowing offset update raises on
every rank and changes nothing (Algorithms 2 and 3), checkpoints refuse other settings, a
bucket whose gradient at w_0 is zero still trains, a receiver on another delta schedule is
refused by name (buckets too), and a schedule built from a float64 norm is the broadcast one."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.algorithms.qesgd import QESGDOptimizer
from gradzip.algorithms.qesgd.codec import OffsetCodec, deltas_digest
from gradzip.algorithms.qesgd.schedule import DeltaSchedule, bucket_norms
from gradzip.algorithms.qesgd.server import DistributedQESGD
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError, NonFiniteInputError, PayloadMismatchError
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload


def test_an_overflowing_offset_update_raises_and_changes_nothing() -> None:
    param = torch.nn.Parameter(torch.ones(6))
    opt = QESGDOptimizer([param], 10.0, schedule=DeltaSchedule((1.0,)), steps_per_epoch=4)
    param.grad = torch.ones(6)
    opt.step()
    before = (param.detach().clone(), opt.epoch_state.state_dict(), opt.encoded_bits)
    param.grad = torch.full((6,), 1e38)  # finite, but 10 * 1e38 is not a float32
    with pytest.raises(NonFiniteInputError, match="overflows"):
        opt.step()
    assert torch.equal(param.detach(), before[0]) and opt.encoded_bits == before[2]
    state = opt.epoch_state.state_dict()
    assert all(torch.equal(state[k], before[1][k]) for k in ("anchor", "z", "zsum"))
    assert (state["k"], state["step"]) == (before[1]["k"], before[1]["step"])


def test_algorithm3_overflow_at_the_server_reaches_every_rank() -> None:
    """Every gradient is finite, their sum is not: the server must tell the workers (which
    are waiting for codes) instead of raising alone; every rank raises, nothing moves, and
    the next step runs."""

    def rank(transport: Transport) -> tuple[str, bool, bytes]:
        q = DistributedQESGD(transport, torch.ones(10), batch_size=3, bits=8)
        q.set_schedule(DeltaSchedule((1.0,)))
        q.step(torch.ones(10), 0.1)
        before = q.current().numpy().tobytes()
        try:
            q.step(torch.full((10,), 3e38), 0.1)
            message = ""
        except NonFiniteInputError as err:
            message = str(err)
        unchanged = q.current().numpy().tobytes() == before and q.state.step == 1
        q.step(torch.ones(10), 0.1, end_epoch=True)
        return message, unchanged, q.current().numpy().tobytes()

    results = run_local(3, rank)
    assert all("overflows" in message for message, _, _ in results), results
    assert all(unchanged for _, unchanged, _ in results)
    assert len({r[2] for r in results}) == 1


def test_algorithm3_checkpoint_refuses_other_settings() -> None:
    def rank(transport: Transport) -> list[str]:
        q = DistributedQESGD(transport, torch.ones(6), batch_size=2, bits=8)
        q.set_schedule(DeltaSchedule((1.0,)))
        q.step(torch.ones(6), 0.1)
        saved = q.state_dict()
        errors = []
        for kwargs in ({"bits": 4}, {"batch_size": 4}, {"output": "last"}, {"run_seed": 1}):
            other = DistributedQESGD(transport, torch.ones(6), **{"batch_size": 2, **kwargs})
            with pytest.raises(ValueError) as err:
                other.load_state_dict(saved)
            errors.append(str(err.value))
        return errors

    for errors in run_local(2, rank):
        for name, message in zip(("bits", "batch_size", "output", "run_seed"), errors, strict=True):
            assert name in message


def test_optimizer_checkpoint_keeps_the_clipped_count() -> None:
    param = torch.nn.Parameter(torch.zeros(4))
    opt = QESGDOptimizer([param], 1.0, bits=2, schedule=DeltaSchedule((1.0,), bits=2))
    param.grad = torch.tensor([5.0, -5.0, 0.0, 0.1])  # the 2-bit grid spans [-1, 0.5]
    opt.step()
    assert opt.clipped_total == 2
    resumed = QESGDOptimizer([torch.nn.Parameter(torch.zeros(4))], 1.0, bits=2)
    resumed.load_state_dict(opt.state_dict())
    assert resumed.clipped_total == 2


def test_a_bucket_with_zero_gradient_at_w0_gets_an_even_share_and_trains() -> None:
    g = torch.tensor([0.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 12.0])  # norm 13
    norms = bucket_norms(g, bucket_size=4)  # (0 0 0 0) (3 4 0 0) (0 12)
    want = [13 * math.sqrt(4 / 10), 5.0, 12.0]
    assert norms.tolist() == pytest.approx(want, rel=1e-6)
    assert bucket_norms(torch.zeros(10), bucket_size=4).tolist() == [0.0, 0.0, 0.0]
    # the first bucket's parameters had no gradient at w_0 but get one later: they must move
    param = torch.nn.Parameter(torch.zeros(10))
    opt = QESGDOptimizer([param], 0.1, bits=8, bucket_size=4, c=1.0)
    opt.calibrate(g)
    assert float(opt.delta()[0]) > 0
    for _ in range(3):
        param.grad = torch.ones(10)
        opt.step()
    assert bool((param.detach()[:4] < 0).all())


def test_algorithm3_calibration_beyond_float32_fails_on_every_rank() -> None:
    def rank(transport: Transport) -> str:
        q = DistributedQESGD(transport, torch.ones(4), batch_size=2)
        try:
            q.calibrate(torch.full((4,), 3e38), count=1)  # the sum's norm exceeds float32
        except NonFiniteInputError as err:
            return str(err)
        return ""

    assert all("overflows float32" in m for m in run_local(2, rank))


def test_parameters_set_from_outside_are_refused_until_rebase() -> None:
    """Loading weights into the model after building the optimizer must not be silently undone
    by the next step (which would write back the old w_t + z)."""
    model = torch.nn.Linear(3, 2)
    opt = QESGDOptimizer(model.parameters(), 0.1, schedule=DeltaSchedule((1.0,)))
    x = torch.ones(4, 3)
    model(x).sum().backward()
    opt.step()
    loaded = {k: torch.full_like(v, 0.25) for k, v in model.state_dict().items()}
    model.load_state_dict(loaded)
    opt.zero_grad()
    model(x).sum().backward()
    with pytest.raises(GradzipError, match="changed outside"):
        opt.step()
    assert bool((model.weight.detach() == 0.25).all())  # nothing was written back
    opt.rebase()
    assert opt.epoch_state.epoch == 1 and opt.epoch_state.k == 0
    opt.step()
    # one step from the loaded weights: 0.25 - 0.1 * 4 on the grid of delta_1, not the old ones
    delta = float(opt.delta()[0])
    assert float((model.weight.detach() - (0.25 - 0.4)).abs().max()) < delta


def test_a_bucketed_payload_names_a_receiver_on_another_schedule() -> None:
    """With buckets the header's delta is 1 (the unit grid), so the deltas' digest in the codec
    parameters is what catches a receiver whose c, epoch or norms differ; it costs a fixed 17
    bytes (a length byte and 16 hex digits) per payload."""
    schedule = DeltaSchedule((3.0, 0.5, 2.0), bits=8, c=2.0, bucket_size=40)
    codec, key = OffsetCodec(bits=8, bucket_size=40), StreamKey(1, 0, 7, 0)
    z = torch.randn(100, generator=torch.Generator().manual_seed(4)) * 0.01
    deltas = schedule.delta(1)
    enc = codec.encode(z, deltas, key)
    assert torch.equal(
        codec.decode(enc.payload, deltas, key, 100),
        OffsetCodec(8, 40).decode(enc.payload, deltas.clone(), key, 100),
    )  # a separately built receiver on the same schedule decodes it
    others = {
        "c": DeltaSchedule(schedule.norms, bits=8, c=3.0, bucket_size=40).delta(1),
        "epoch": schedule.delta(2),
        "norms": DeltaSchedule((3.0, 0.5, 2.5), bits=8, c=2.0, bucket_size=40).delta(1),
    }
    for name, theirs in others.items():
        with pytest.raises(PayloadMismatchError, match="another delta schedule") as err:
            codec.decode(enc.payload, theirs, key, 100)
        assert deltas_digest(deltas) in str(err.value), name
        assert deltas_digest(theirs) in str(err.value), name
        assert len(codec.encode(z, theirs, key).payload) == len(enc.payload)  # fixed size
    single = OffsetCodec(bits=8).encode(z, torch.tensor([1e-3]), key)
    assert len(enc.payload) == len(single.payload) + 17
    assert enc.wire_bits == overhead_bits(parse_payload(enc.payload)[0]) + 8 * 100
    # one bucket: the header's delta names both values
    with pytest.raises(PayloadMismatchError, match=r"delta 0\.00100.* != 0\.00200"):
        OffsetCodec(bits=8).decode(single.payload, torch.tensor([2e-3]), key, 100)


def test_algorithm3_with_buckets_refuses_a_worker_on_another_schedule() -> None:
    def rank(transport: Transport) -> str:
        q = DistributedQESGD(transport, torch.ones(10), batch_size=2, bits=8, bucket_size=4)
        c = 2.0 if transport.rank == 1 else 1.0  # rank 1 was configured with another c
        q.set_schedule(DeltaSchedule((1.0, 2.0, 0.5), bits=8, c=c, bucket_size=4))
        try:
            q.step(torch.ones(10), 0.1)
        except PayloadMismatchError as err:
            return str(err)
        return ""

    server, worker = run_local(2, rank)
    assert server == "" and "another delta schedule" in worker


def test_a_schedule_from_a_float64_norm_is_the_broadcast_float32_one() -> None:
    norm64 = 4.299898331862717  # not a float32; kept unrounded, its epoch-1 delta at c=3 differs
    norm32 = float(torch.tensor(norm64, dtype=torch.float32))
    local, received = DeltaSchedule((norm64,), 8, 3.0), DeltaSchedule((norm32,), 8, 3.0)
    assert local == received and local.norms == (norm32,)
    for t in range(4):
        assert torch.equal(local.delta(t), received.delta(t))
    with pytest.raises(ValueError, match="float32"):
        DeltaSchedule((1e39,))  # finite in float64, not in float32
    # end to end: the float64 norm of the ranks' summed shares gives calibrate's schedule

    def rank(transport: Transport) -> tuple[torch.Tensor, DeltaSchedule]:
        share = torch.linspace(-1, 1, 7) * (transport.rank + 1.37)
        q = DistributedQESGD(transport, torch.zeros(7), batch_size=2, c=3.0)
        return share, q.calibrate(share, count=3)

    results = run_local(2, rank)
    total = torch.zeros(7, dtype=torch.float64)
    for share, _ in results:  # rank order, float64, as the server adds them
        total += share.to(torch.float64)
    full64 = float(torch.linalg.vector_norm(total / 3))
    assert full64 != float(torch.tensor(full64, dtype=torch.float32))
    assert all(s == DeltaSchedule((full64,), 8, 3.0) for _, s in results)
