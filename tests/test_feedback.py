"""ErrorFeedback (spec 0.6): telescoping, bounded residuals, state, and failure atomicity."""

from __future__ import annotations

import io

import pytest
import torch

import gradzip
from gradzip.compressors import Compressor, get, names
from gradzip.errors import NonFiniteInputError
from gradzip.feedback import ErrorFeedback
from gradzip.keys import StreamKey

KEY = StreamKey(run_seed=3, rank=1, step=0, tensor_index=4)
EF_CODECS = [
    n
    for n in ("identity", "fp16", "bf16", "topk", "randk", "dqsg", "qsgd", "onebit", "hou")
    if n in names()
]


def make(name: str) -> Compressor:
    cls = get(name)
    return cls(**cls.example_params)


def gradients(steps: int, shape: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) * (1 + t % 3) for t in range(steps)]


@pytest.mark.parametrize("name", EF_CODECS)
def test_telescoping_sum(name: str) -> None:
    """sum_t v_hat_t = sum_t g_t + e_0 - e_T, with v_hat decoded by a separate receiver."""
    ef, receiver = ErrorFeedback(make(name)), make(name)
    steps, shape = 25, (37, 3)
    total_hat = torch.zeros(shape, dtype=torch.float64)
    total_g = torch.zeros(shape, dtype=torch.float64)
    for t, g in enumerate(gradients(steps, shape)):
        key = KEY.with_step(t)
        enc, v_hat = ef.round_trip(g, key)
        received = receiver.decode(enc.payload, expected_key=key)
        assert torch.equal(received, v_hat)  # the sender's copy is the receiver's, bitwise
        total_hat += received.double()
        total_g += g.double()
    e_T = ef.residual(KEY.tensor_index).double()
    # each step rounds v = g + e and e = v - v_hat once in float32
    tol = steps * 2.0**-22 * (total_g.abs().max() + e_T.abs().max() + 10)
    assert float((total_hat - (total_g - e_T)).abs().max()) <= float(tol)


def test_identity_residual_stays_zero_and_float64_is_kept() -> None:
    ef = ErrorFeedback(gradzip.create("identity"))
    for t, g in enumerate(gradients(3, (10,))):
        ef.encode(g.double(), KEY.with_step(t))
        res = ef.residual(KEY.tensor_index)
        assert res.dtype == torch.float64 and bool((res == 0).all())


def test_half_precision_input_uses_a_float32_residual() -> None:
    ef = ErrorFeedback(gradzip.create("topk", k=2))
    enc = ef.encode(torch.randn(8).half(), KEY)
    assert ef.residual(KEY.tensor_index).dtype == torch.float32
    assert ef.decode(enc.payload).dtype == torch.float32


def test_topk_residual_obeys_the_contraction_bound() -> None:
    """For a delta-contraction, ||e_t||^2 <= 4 (1 - delta) / delta^2 * max_t ||g_t||^2."""
    d, k = 50, 5
    delta = k / d
    ef = ErrorFeedback(gradzip.create("topk", k=k))
    gs = gradients(200, (d,), seed=4)
    bound = 4 * (1 - delta) / delta**2 * max(float(g.norm()) ** 2 for g in gs)
    for t, g in enumerate(gs):
        ef.encode(g, KEY.with_step(t))
        assert float(ef.residual(KEY.tensor_index).norm()) ** 2 <= bound


def test_slots_are_per_tensor_and_chunk() -> None:
    ef = ErrorFeedback(gradzip.create("topk", k=1))
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([5.0, 4.0])
    ef.encode(a, StreamKey(tensor_index=0))
    ef.encode(b, StreamKey(tensor_index=0, chunk=1))
    ef.encode(b, StreamKey(tensor_index=1))
    assert ef.residual(0).tolist() == [1.0, 2.0, 0.0]
    assert ef.residual(0, chunk=1).tolist() == [0.0, 4.0]
    assert ef.residual(1).tolist() == [0.0, 4.0]
    # the next message carries the residual: 1+1, 2+2, 0+3 -> keeps index 1
    enc = ef.encode(a, StreamKey(step=1, tensor_index=0))
    assert ef.decode(enc.payload).tolist() == [0.0, 4.0, 0.0]
    ef.reset()
    with pytest.raises(KeyError, match="tensor_index 0, chunk 0"):
        ef.residual(0)


def test_state_dict_round_trip_resumes_bit_exactly() -> None:
    gs = gradients(12, (20, 5), seed=2)
    first = ErrorFeedback(gradzip.create("randk", ratio=0.2))
    for t in range(6):
        first.encode(gs[t], KEY.with_step(t))
        first.encode(gs[t][:3], StreamKey(step=t, tensor_index=9, chunk=2))
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    second = ErrorFeedback(gradzip.create("randk", ratio=0.2))
    second.load_state_dict(torch.load(buffer, weights_only=True))
    for t in range(6, 12):
        a = first.encode(gs[t], KEY.with_step(t))
        b = second.encode(gs[t], KEY.with_step(t))
        assert a.payload == b.payload
    assert torch.equal(first.residual(KEY.tensor_index), second.residual(KEY.tensor_index))
    assert torch.equal(first.residual(9, 2), second.residual(9, 2))


def test_failed_encode_leaves_the_state_untouched() -> None:
    ef = ErrorFeedback(gradzip.create("topk", k=3))
    for t, g in enumerate(gradients(4, (10,))):
        ef.encode(g, KEY.with_step(t))
    before = ef.state_dict()
    bad = torch.randn(10)
    bad[4] = float("nan")
    with pytest.raises(NonFiniteInputError):
        ef.encode(bad, KEY.with_step(4))
    with pytest.raises(ValueError, match=r"\(2, 5\).*\(10,\)"):
        ef.encode(torch.randn(2, 5), KEY.with_step(4))
    # finite g whose g + e overflows float32 also raises without touching e
    big = ErrorFeedback(gradzip.create("topk", k=1))
    big.load_state_dict(
        {"version": 1, "tensor_index": [0], "chunk": [0], "residual": [torch.full((2,), 3e38)]}
    )
    with pytest.raises(NonFiniteInputError):
        big.encode(torch.full((2,), 3e38), StreamKey())
    assert torch.equal(big.residual(0), torch.full((2,), 3e38))
    after = ef.state_dict()
    assert all(
        torch.equal(x, y) for x, y in zip(before["residual"], after["residual"], strict=True)
    )


def test_load_state_dict_validates() -> None:
    ef = ErrorFeedback(gradzip.create("topk", k=1))
    ef.encode(torch.randn(4), KEY)
    state = ef.state_dict()
    wrong = dict(state, residual=[torch.zeros(5)])
    with pytest.raises(ValueError, match=r"\(5,\).*\(4,\)"):
        ef.load_state_dict(wrong)
    with pytest.raises(ValueError, match="version"):
        ef.load_state_dict(dict(state, version=99))
    with pytest.raises(ValueError, match="NaN"):
        ef.load_state_dict(dict(state, residual=[torch.full((4,), float("nan"))]))
    assert torch.equal(ef.residual(KEY.tensor_index), state["residual"][0])  # kept


def test_side_information_codec_passes_side_to_the_sender_decode() -> None:
    ef, receiver = ErrorFeedback(make("ndqsg")), make("ndqsg")
    total_hat = torch.zeros(30, dtype=torch.float64)
    total_g = torch.zeros(30, dtype=torch.float64)
    for t, g in enumerate(gradients(10, (30,), seed=5)):
        side = g + 0.01 * torch.randn(30, generator=torch.Generator().manual_seed(t))
        enc = ef.encode(g, KEY.with_step(t), side=side)
        total_hat += receiver.decode(enc.payload, expected_key=KEY.with_step(t), side=side).double()
        total_g += g.double()
    e_T = ef.residual(KEY.tensor_index).double()
    assert torch.allclose(total_hat, total_g - e_T, atol=1e-4)


def test_snapshot_restore_undoes_later_encodes() -> None:
    ef = ErrorFeedback(gradzip.create("topk", k=3))
    gen = torch.Generator().manual_seed(21)
    ef.encode(torch.randn(50, generator=gen), StreamKey(tensor_index=0))
    before = ef.residual(0)
    point = ef.snapshot()
    ef.encode(torch.randn(50, generator=gen), StreamKey(step=1, tensor_index=0))
    ef.encode(torch.randn(50, generator=gen), StreamKey(step=1, tensor_index=1))
    assert not torch.equal(ef.residual(0), before)
    ef.restore(point)
    assert torch.equal(ef.residual(0), before)  # later encodes did not touch the held tensors
    with pytest.raises(KeyError):
        ef.residual(1)


def test_two_phase_compensation_changes_nothing_until_committed() -> None:
    """``compensated`` gives ``g + e`` and leaves the residual; ``commit`` keeps ``v - v_hat``:
    together the residual of ``compensate``."""
    fb = ErrorFeedback(gradzip.create("qsgd", s=2))
    key = StreamKey(tensor_index=2)
    g = torch.randn(50, generator=torch.Generator().manual_seed(3))
    fb.compensate(g, key, lambda v: (None, v.round()))
    before = fb.residual(2)
    slot, v = fb.compensated(g, key)
    assert slot == (2, 0)
    assert torch.equal(v, g + before) and torch.equal(fb.residual(2), before)
    expected = (g + before) - (g + before).round()
    fb.commit(slot, v, v.clone().round())
    assert torch.equal(fb.residual(2), expected)


def test_compensated_values_can_be_written_where_the_caller_wants_them() -> None:
    """``compensated(..., out=view)`` writes ``v = g + e`` into the caller's memory (a batch's
    concatenation), with the bits of a fresh ``v``; an ``out`` of another size, dtype or
    layout is refused by name and nothing changes."""
    feedback = ErrorFeedback(gradzip.create("qsgd", s=2))
    key = StreamKey(run_seed=1, step=0, rank=0, tensor_index=3)
    g = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    slot, v = feedback.compensated(g, key)
    feedback.commit(slot, v, torch.zeros_like(v) + 0.25)
    residual = feedback.residual(3)
    concatenation = torch.full((30,), float("nan"))
    slot, v = feedback.compensated(g, key, out=concatenation.narrow(0, 5, 20))
    assert v.shape == g.shape and v.data_ptr() == concatenation.narrow(0, 5, 20).data_ptr()
    assert torch.equal(v, g + residual)
    assert concatenation[:5].isnan().all() and concatenation[25:].isnan().all()
    for bad in (torch.empty(19), torch.empty(20, dtype=torch.float64), torch.empty(40)[::2]):
        with pytest.raises(ValueError, match="error feedback's out must be 20 contiguous"):
            feedback.compensated(g, key, out=bad)
    assert torch.equal(feedback.residual(3), residual)
