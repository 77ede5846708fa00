"""Error feedback's fused step for the per-bucket-scale stochastic quantizers (QSGD, TernGrad,
Hou): the reconstruction built from the encoder's own symbols and scales is the decoder's, bit
for bit, and the payloads and residuals are those of the unfused path (encode, decode the
payload, subtract)."""

from __future__ import annotations

import pytest
import torch

from gradzip.compressors._scaled_stochastic import ScaledStochastic
from gradzip.compressors.hou import Hou
from gradzip.compressors.qsgd import QSGD
from gradzip.compressors.terngrad import TernGrad
from gradzip.errors import NonFiniteInputError
from gradzip.feedback import ErrorFeedback, FusedFeedback
from gradzip.keys import StreamKey

CODECS = {
    "qsgd s=1": lambda: QSGD(),
    "qsgd s=16 one bucket": lambda: QSGD(s=16, bucket_size=None),
    "qsgd s=127 buckets of 64": lambda: QSGD(s=127, bucket_size=64),
    "qsgd s=300 (int32 symbols)": lambda: QSGD(s=300, bucket_size=None),
    "qsgd l2 norm": lambda: QSGD(s=4, norm="l2"),
    "terngrad": lambda: TernGrad(),
    "terngrad clipped": lambda: TernGrad(clip_sigma=2.5),
    "hou scaled": lambda: Hou(b=4, scaled=True),
}


def _unfused(codec: ScaledStochastic) -> ScaledStochastic:
    """The same codec with the fused step switched off (the generic decode-and-subtract)."""
    unfused = type("Unfused", (type(codec),), {"encode_with_feedback": None})
    plain: ScaledStochastic = unfused.__new__(unfused)
    plain.__dict__.update(codec.__dict__)
    assert not isinstance(plain, FusedFeedback)
    return plain


@pytest.mark.parametrize("name", sorted(CODECS))
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 3, 16, 16), (1000,), (5, 40_000)])
def test_fused_feedback_equals_the_unfused_path(name: str, shape: tuple[int, ...]) -> None:
    codec = CODECS[name]()
    assert isinstance(codec, FusedFeedback)
    fused_ef, plain_ef = ErrorFeedback(codec), ErrorFeedback(_unfused(codec))
    gen = torch.Generator().manual_seed(sum(shape) + len(name))
    # the fused step serves this configuration (else both sides would run the generic path)
    assert codec.encode_with_feedback(torch.randn(shape, generator=gen), StreamKey(7, 1, 9, 5))
    for step in range(4):
        g = torch.randn(shape, generator=gen) * 10.0 ** (step - 2)
        if step == 3:
            g.view(-1)[: max(1, g.numel() // 3)] = 0.0  # zero buckets and -0.0-free sums
        key = StreamKey(7, 1, step, 2)
        a, a_hat = fused_ef.round_trip(g, key)
        b, b_hat = plain_ef.round_trip(g, key)
        assert bytes(a.payload) == bytes(b.payload)
        assert (a.paper_bits, a.side_bits) == (b.paper_bits, b.side_bits)
        assert a_hat.view(torch.int32).equal(b_hat.view(torch.int32))
        decoded = codec.decode(a.payload, expected_key=key, shape=shape)
        assert decoded.view(torch.int32).equal(a_hat.view(torch.int32))
        residual, plain_residual = fused_ef.residual(2), plain_ef.residual(2)
        assert residual.view(torch.int32).equal(plain_residual.view(torch.int32))
        # without the reconstruction (encode only): the same payload and residual
        other = StreamKey(7, 1, step, 3)
        assert bytes(fused_ef.encode(g, other).payload) == bytes(plain_ef.encode(g, other).payload)
        assert fused_ef.residual(3).view(torch.int32).equal(plain_ef.residual(3).view(torch.int32))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_fused_feedback_refuses_non_finite_input_and_keeps_its_state(bad: float) -> None:
    ef = ErrorFeedback(QSGD(s=16, bucket_size=None))
    g = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    key = StreamKey(7, 1, 0, 2)
    ef.encode(g, key)
    before = ef.residual(2).clone()
    g[1, 2, 3, 4] = bad
    with pytest.raises(NonFiniteInputError):
        ef.encode(g, StreamKey(7, 1, 1, 2))
    assert ef.residual(2).view(torch.int32).equal(before.view(torch.int32))


def test_inputs_the_fused_step_does_not_serve_are_left_to_the_generic_path() -> None:
    codec = QSGD(s=16, bucket_size=None)
    key = StreamKey(7, 1, 0, 2)
    for v in (
        torch.randn(8, dtype=torch.float64),  # float64 residuals
        torch.randn(8, 2).t(),  # not contiguous
        torch.empty(0),
    ):
        before = v.clone()
        assert codec.encode_with_feedback(v, key) is None
        assert torch.equal(v, before)
    for other in (QSGD(s=4, coding="elias"), QSGD(s=4, packing="dense")):
        v = torch.randn(100)
        assert other.encode_with_feedback(v, key) is None


def test_a_reconstruction_the_bound_cannot_prove_finite_is_left_to_the_decoder() -> None:
    """A scale at float32's largest, whose multiplier f32(scale / 127) times 127 exceeds it:
    the fused step declines (v untouched), leaving the generic path to decode and check the
    values."""
    codec = QSGD(s=127, bucket_size=None)
    v = torch.tensor([torch.finfo(torch.float32).max, -1.0, 2.0])
    before = v.clone()
    assert codec.encode_with_feedback(v, StreamKey(7, 1, 0, 2)) is None
    assert torch.equal(v, before)
