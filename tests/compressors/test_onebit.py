"""One-bit quantization (spec 5.1, 5.4, 1.9): column sums, wire layout, sampling, EF."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gradzip.compressors.onebit as onebit_module
from gradzip.compressors.onebit import OneBit
from gradzip.errors import CorruptPayloadError, NonFiniteInputError, PayloadError
from gradzip.feedback import ErrorFeedback
from gradzip.kernels.onebit_signs import column_means_torch
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, overhead_bits, parse_payload
from tests.kernels.test_onebit_signs import _reference_pack, _tree_sums

KEY = StreamKey(run_seed=5, rank=2, step=3, tensor_index=1)


def columns(x: torch.Tensor, group: str) -> torch.Tensor:
    """Reference grouping: one row per column (the spec's 'column')."""
    if x.dim() <= 1:
        return x.reshape(1, -1)
    a = x.reshape(x.shape[0], -1)
    return a if group == "out" else a.t()


def body_means(comp: OneBit, x: torch.Tensor, key: StreamKey = KEY) -> torch.Tensor:
    """The transmitted (mu+, mu-) per column, read from the wire layout."""
    _, body = parse_payload(comp.encode(x, key).payload)
    rows = columns(x, comp.group).shape[1]
    raw = np.frombuffer(body, dtype=np.uint8).reshape(-1, 8 + 4 * math.ceil(rows / 32))
    return torch.from_numpy(raw[:, :8].copy().view(np.float32))


@pytest.mark.parametrize("group", ["out", "in"])
@pytest.mark.parametrize("shape", [(), (1,), (37,), (33, 17), (5, 3, 4, 2), (64, 129)])
def test_reconstruction_and_exact_column_sums(group: str, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(shape, generator=gen) * 3 + 0.4
    comp = OneBit(group=group)
    _, y = comp.round_trip(x, KEY)
    cx, cy = columns(x, group), columns(y, group)
    pos = cx >= 0
    for c in range(cx.shape[0]):
        n_pos = int(pos[c].sum())
        mu_pos = float(cx[c][pos[c]].double().mean()) if n_pos else 0.0
        mu_neg = float(cx[c][~pos[c]].double().mean()) if n_pos < cx.shape[1] else 0.0
        ref = torch.where(pos[c], torch.tensor(mu_pos), torch.tensor(mu_neg)).float()
        # each mean is its own sign's float64 mean rounded to float32
        assert torch.allclose(cy[c], ref, rtol=1e-6, atol=0.0)
    scale = cx.abs().sum(dim=1).double() + 1e-30
    err = (cy.double().sum(dim=1) - cx.double().sum(dim=1)).abs() / scale
    assert float(err.max()) < 1e-6


@pytest.mark.parametrize(
    "column", [[-1e10, 1e-3, 2e-3], [-1.0, 1e-7, 3e-8], [-1e30, 1e-30, 1.0], [5e9, -2e-4, 1.0]]
)
def test_small_side_next_to_a_huge_one_keeps_its_mean(column: list[float]) -> None:
    x = torch.tensor(column)
    _, y = OneBit().round_trip(x, KEY)
    for side in (x >= 0, x < 0):
        expected = float(x[side].double().mean())
        assert torch.allclose(y[side].double(), torch.tensor(expected).double(), rtol=1e-6)


def test_zero_counts_as_positive_and_one_sided_columns() -> None:
    x = torch.tensor([[0.0, -0.0, 2.0, -4.0], [-1.0, -3.0, -2.0, -6.0], [1.0, 0.0, 5.0, 2.0]])
    _, y = OneBit().round_trip(x, KEY)
    expected = torch.tensor(
        [[2 / 3, 2 / 3, 2 / 3, -4.0], [-3.0, -3.0, -3.0, -3.0], [2.0, 2.0, 2.0, 2.0]]
    )
    assert torch.equal(y, expected.float())
    assert body_means(OneBit(), x)[1].tolist() == [0.0, -3.0]  # no positives: mu+ = 0


def test_wire_layout_bit_counts_and_paper_bits() -> None:
    x = torch.randn(3, 70, generator=torch.Generator().manual_seed(1))
    comp = OneBit()
    enc = comp.encode(x, KEY)
    header, body = parse_payload(enc.payload)
    assert len(body) * 8 == 3 * (64 + 32 * 3) == comp.expected_body_bits(x)
    assert enc.wire_bits == overhead_bits(header) + comp.expected_body_bits(x)
    assert enc.paper_bits == 3 * 70 + 64 * 3  # n + 64 * #groups (DQSG Table 1 form)
    assert enc.side_bits == 64 * 3
    raw = np.frombuffer(body, dtype=np.uint8).reshape(3, 8 + 12)
    words = raw[:, 8:].copy().view("<u4")  # three uint32 words per column, LSB-first
    for c in range(3):
        bits = [(int(words[c, i // 32]) >> (i % 32)) & 1 for i in range(96)]
        assert bits[:70] == (x[c] >= 0).int().tolist() and not any(bits[70:])


def test_bad_bodies_are_rejected() -> None:
    x = torch.randn(2, 40, generator=torch.Generator().manual_seed(2))
    comp = OneBit()
    header, body = parse_payload(comp.encode(x, KEY).payload)
    padded = bytearray(body)
    padded[-1] |= 0x80  # a padding bit of the last column
    with pytest.raises(CorruptPayloadError, match="padding"):
        comp.decode(build_payload(header, [bytes(padded)]))
    nan_mean = bytearray(body)
    nan_mean[0:4] = np.array([np.nan], dtype=np.float32).tobytes()
    with pytest.raises(CorruptPayloadError, match="finite"):
        comp.decode(build_payload(header, [bytes(nan_mean)]))
    for cut in (0, 7, len(body) - 1):
        with pytest.raises(PayloadError):
            comp.decode(build_payload(header, [bytes(body[:cut])]))


def test_sampling_equals_exact_statistics_when_rows_fit() -> None:
    x = torch.randn(10, 128, generator=torch.Generator().manual_seed(3))
    assert torch.equal(body_means(OneBit(sample=True), x), body_means(OneBit(), x))


def test_sampled_means_are_unbiased() -> None:
    """Given at least one sampled entry of a sign, the sampled entries of that sign are i.i.d.
    draws from the column's entries of that sign, so each estimate is unbiased: the mean error
    over 2000 columns lies within 5 standard errors of 0."""
    cols, rows = 2000, 1000
    ramp = torch.linspace(-1, 1, rows)  # rows are not exchangeable: all must be sampled
    x = torch.randn(cols, rows, generator=torch.Generator().manual_seed(4)).exp() - 1.5 + ramp
    exact = body_means(OneBit(), x).double()
    est = body_means(OneBit(sample=True), x).double()
    assert not torch.equal(exact, est)
    err = est - exact
    tol = 5 * err.std(dim=0) / math.sqrt(cols)
    assert bool((err.mean(dim=0).abs() < tol).all()), (err.mean(dim=0), tol)


def test_sampled_means_converge_as_the_sample_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Error standard deviation ~ sigma_side / sqrt(samples of that side): check every column
    within 5 of its own standard errors, and that the worst error shrinks like 1/sqrt(s)."""
    x = torch.randn(40, 4096, generator=torch.Generator().manual_seed(5))
    c = columns(x, "out").double()
    exact = body_means(OneBit(), x).double()
    sd = torch.stack(
        [
            torch.stack([row[row >= 0].std(), row[row < 0].std()])
            / torch.stack([(row >= 0).double().mean(), (row < 0).double().mean()]).sqrt()
            for row in c
        ]
    )
    worst = []
    for size in (128, 512, 2048):
        monkeypatch.setattr(onebit_module, "SAMPLE_ROWS", size)
        err = (body_means(OneBit(sample=True), x).double() - exact).abs()
        assert bool((err < 5 * sd / math.sqrt(size)).all()), size
        worst.append(float(err.max()))
    assert worst[0] > worst[1] > worst[2]


@pytest.mark.parametrize("kw", [{}, {"group": "in"}, {"sample": True}])
def test_error_feedback_telescopes(kw: dict[str, object]) -> None:
    """Spec 0.6: sum_t v_hat_t = sum_t g_t + e_0 - e_T, with an explicit EF loop."""
    gen = torch.Generator().manual_seed(6)
    comp = OneBit(**kw)  # type: ignore[arg-type]
    e = torch.zeros(20, 300)
    total_g = torch.zeros(20, 300, dtype=torch.float64)
    total_hat = torch.zeros_like(total_g)
    for t in range(30):
        g = torch.randn(20, 300, generator=gen)
        v = g + e
        _, v_hat = comp.round_trip(v, KEY.with_step(t))
        e = v - v_hat
        total_g += g
        total_hat += v_hat.double()
    assert torch.allclose(total_hat, total_g - e.double(), atol=1e-4, rtol=0)
    assert float(e.abs().max()) < 10  # the residual stays bounded


@pytest.mark.parametrize("kw", [{}, {"sample": True}])
def test_error_feedback_wrapper_telescopes(kw: dict[str, object]) -> None:
    gen = torch.Generator().manual_seed(7)
    ef = ErrorFeedback(OneBit(**kw))  # type: ignore[arg-type]
    total_g = torch.zeros(20, 300, dtype=torch.float64)
    total_hat = torch.zeros_like(total_g)
    for t in range(30):
        g = torch.randn(20, 300, generator=gen)
        key = KEY.with_step(t)
        enc = ef.encode(g, key)
        total_g += g
        total_hat += ef.decode(enc.payload, expected_key=key).double()
    e_T = ef.residual(KEY.tensor_index).double()
    assert torch.allclose(total_hat, total_g - e_T, atol=1e-4, rtol=0)


@pytest.mark.parametrize("packing", ["dense", "entropy"])
def test_other_packings_carry_the_same_values(packing: str) -> None:
    x = torch.randn(21, 45, generator=torch.Generator().manual_seed(8)) + 0.8  # skewed signs
    comp = OneBit(packing=packing)
    enc, y = comp.round_trip(x, KEY)
    assert torch.equal(y, OneBit().round_trip(x, KEY)[1])
    header, body = parse_payload(enc.payload)
    if packing == "dense":
        assert 8 * len(body) == comp.expected_body_bits(x) == 64 * 21 + 8 * math.ceil(945 / 8)
    else:
        assert comp.expected_body_bits(x) is None
        assert 8 * len(body) < 64 * 21 + 945  # skewed signs compress below one bit each
    for cut in (0, 5, len(body) - 1):
        with pytest.raises(PayloadError):
            comp.decode(build_payload(header, [bytes(body[:cut])]))


def test_contraction_identity() -> None:
    """||V - V_hat||^2 = ||V||^2 - sum_c (n+ mu+^2 + n- mu-^2): the means are least squares."""
    x = torch.randn(50, 77, generator=torch.Generator().manual_seed(9)).double() * 2 + 0.5
    comp = OneBit()
    y = comp.round_trip(x.float(), KEY)[1].double()
    x = x.float().double()
    means = body_means(comp, x.float()).double()
    n_pos = (x >= 0).sum(dim=1).double()
    kept = (n_pos * means[:, 0] ** 2 + (77 - n_pos) * means[:, 1] ** 2).sum()
    err = ((x - y) ** 2).sum()
    assert math.isclose(float(err), float((x**2).sum() - kept), rel_tol=1e-5)
    assert float(err) < float((x**2).sum())


def test_huge_values_do_not_overflow_the_means() -> None:
    """Float32 sums of values near the float32 limit overflow; the means must stay finite."""
    x = torch.tensor([[3e38, 3e38, -3e38, 1.0], [3e38, -1e-30, 2e38, 0.0]])
    _, y = OneBit().round_trip(x, KEY)
    assert bool(torch.isfinite(y).all())
    assert torch.allclose(y.double().sum(1), x.double().sum(1), rtol=1e-6)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (4, 3, 11), (33, 70), (2, 1, 65)])
@pytest.mark.parametrize("group", ["out", "in"])
def test_fixed_body_is_byte_identical_to_the_previous_encoder(
    shape: tuple[int, ...], group: str
) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape) * 31 + shape[-1]))
    comp = OneBit(group=group)
    _, body = parse_payload(comp.encode(x, StreamKey()).payload)
    m = onebit_module.Grouping.of(shape, group).matrix(x.reshape(-1)).contiguous()
    bits, n_pos = _reference_pack(m.numpy())
    means = column_means_torch(torch.from_numpy(n_pos).reshape(-1, 1), _tree_sums(m), m.shape[1])
    expected = np.concatenate([means.numpy().view(np.uint8), bits], axis=1)
    assert bytes(body) == expected.tobytes()


@pytest.mark.parametrize("shape", [(7,), (33, 70), (4, 3, 11), (300, 129)])
@pytest.mark.parametrize("group", ["out", "in"])
@pytest.mark.parametrize("sample", [False, True])
def test_fused_feedback_equals_the_unfused_path(
    shape: tuple[int, ...], group: str, sample: bool
) -> None:
    """The fused error-feedback step gives the unfused path's payloads, residuals and
    reconstructions bit for bit, over several steps."""
    comp = OneBit(group=group, sample=sample)

    class Unfused(OneBit):
        encode_with_feedback = None  # type: ignore[assignment]

    plain = Unfused(group=group, sample=sample)
    plain.name = comp.name
    fused_ef, plain_ef = ErrorFeedback(comp), ErrorFeedback(plain)
    assert plain_ef.inner.encode_with_feedback is None
    gen = torch.Generator().manual_seed(sum(shape))
    for step in range(3):
        g = torch.randn(shape, generator=gen)
        key = StreamKey(1, 0, step, 2)
        a, a_hat = fused_ef.round_trip(g, key)
        b, b_hat = plain_ef.round_trip(g, key)
        assert bytes(a.payload) == bytes(b.payload)
        assert a_hat.dtype == b_hat.dtype and torch.equal(a_hat, b_hat)
        assert a_hat.view(torch.int32).equal(b_hat.view(torch.int32))
        assert torch.equal(comp.decode(a.payload, expected_key=key, shape=shape), a_hat)
        ra, rb = fused_ef.residual(2), plain_ef.residual(2)
        assert ra.view(torch.int32).equal(rb.view(torch.int32))
        assert bytes(fused_ef.encode(g, StreamKey(1, 0, step, 3)).payload) == bytes(
            plain_ef.encode(g, StreamKey(1, 0, step, 3)).payload
        )
        assert fused_ef.residual(3).view(torch.int32).equal(plain_ef.residual(3).view(torch.int32))


def test_fused_feedback_refuses_non_finite_input_and_keeps_its_state() -> None:
    ef = ErrorFeedback(OneBit())
    g = torch.randn(8, 40, generator=torch.Generator().manual_seed(3))
    ef.encode(g, KEY)
    before = ef.residual(KEY.tensor_index)
    for bad in (float("nan"), float("inf")):
        g2 = g.clone()
        g2[5, 3] = bad
        with pytest.raises(NonFiniteInputError, match="NaN or Inf"):
            ef.encode(g2, KEY)
        assert torch.equal(ef.residual(KEY.tensor_index), before)


@pytest.mark.parametrize("group", ["out", "in"])
def test_sign_stream_is_built_on_request_and_equals_the_signs(group: str) -> None:
    """The fixed packing rebuilds its entropy stream from the packed words when asked: the
    signs ``1[V >= 0]`` of the grouped matrix, as the other packings write them eagerly."""
    x = torch.randn(6, 45, generator=torch.Generator().manual_seed(8))
    x[0, :9] = -0.0
    fixed, dense = OneBit(group=group).encode(x), OneBit(group=group, packing="dense").encode(x)
    assert torch.equal(fixed.streams[0].reshape(-1), dense.streams[0].reshape(-1))
    matrix = x if group == "out" else x.t()
    assert torch.equal(fixed.streams[0], (matrix >= 0).to(torch.uint8))
    assert fixed.entropy_bits == dense.entropy_bits


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e300])
def test_encode_refuses_non_finite_input_in_its_packing_pass(bad: float) -> None:
    """No separate scan runs before the packing: its pass refuses NaN, Inf and float64 values
    beyond the float32 range (infinite once cast)."""
    x = torch.randn(3, 70, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    x[2, 65] = bad
    with pytest.raises(NonFiniteInputError, match="NaN or Inf"):
        OneBit().encode(x)


# -- the device path (issue 28): non-default configurations ---------------------------------
DEVICE_CASES = [
    ({}, (4097,)),
    ({"group": "in"}, (33, 65)),
    ({"group": "out"}, (3, 40, 7)),
    ({"sample": True}, (6, 300)),
    ({"sample": True, "group": "in"}, (300, 5)),
    ({}, (300_001,)),  # three 2**12-word segments: the kernels' combined order
]


def _device_gradient(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.rand(shape, generator=g).pow(3)
    x.view(-1)[::7] = 0.0
    x.view(-1)[1::11] = -0.0
    return x


@pytest.mark.parametrize(("params", "shape"), DEVICE_CASES)
def test_device_path_equals_host_path(params: dict, shape: tuple[int, ...]) -> None:
    from tests.compressors.device_checks import check_device_decode, check_twin_bytes

    codec = OneBit(**params)
    assert codec.device_resident
    x = _device_gradient(shape)
    check_twin_bytes(codec, x, KEY)
    check_device_decode(codec, x, KEY)


@pytest.mark.parametrize(("params", "shape"), DEVICE_CASES[:5])
def test_device_path_encodes_fake_cuda(params: dict, shape: tuple[int, ...]) -> None:
    from tests.compressors.device_checks import encode_fake_cuda

    codec = OneBit(**params)
    assert encode_fake_cuda(codec, shape, KEY) == len(codec.encode(torch.randn(shape), KEY).payload)


@pytest.mark.parametrize("packing", ["dense", "entropy"])
def test_symbol_packings_stay_on_the_host(packing: str) -> None:
    from gradzip.device.mode import forced_device_payloads

    codec = OneBit(packing=packing)
    assert not codec.device_resident
    x = _device_gradient((1000,))
    with forced_device_payloads():
        payload = codec.encode(x, KEY).payload
    assert not isinstance(payload, torch.Tensor)
    assert bytes(payload) == bytes(codec.encode(x, KEY).payload)


@pytest.mark.parametrize("group", ["out", "in"])
@pytest.mark.parametrize("reconstruct", [False, True])
def test_fused_feedback_on_device_equals_host(group: str, reconstruct: bool) -> None:
    from gradzip.device.host_reads import count_host_reads
    from gradzip.device.mode import forced_device_payloads

    codec = OneBit(group=group)
    v = _device_gradient((33, 65), seed=4)
    host_v, dev_v = v.clone(), v.clone()
    host = codec.encode_with_feedback(host_v, KEY, reconstruct=reconstruct)
    with forced_device_payloads(), count_host_reads() as reads:
        device = codec.encode_with_feedback(dev_v, KEY, reconstruct=reconstruct)
    assert reads.count == 0, reads.describe()
    assert host is not None and device is not None
    assert isinstance(device[0].payload, torch.Tensor)
    assert bytes(device[0].payload.numpy()) == bytes(host[0].payload)
    assert torch.equal(dev_v.view(torch.int32), host_v.view(torch.int32))
    if reconstruct:
        assert host[1] is not None and device[1] is not None
        assert torch.equal(device[1].view(torch.int32), host[1].view(torch.int32))
    else:
        assert device[1] is None


def test_fused_feedback_on_device_flags_non_finite_and_keeps_v() -> None:
    from gradzip.device.mode import forced_device_payloads

    codec = OneBit()
    v = _device_gradient((500,))
    v[3] = float("inf")
    before = v.clone()
    with forced_device_payloads():
        fused = codec.encode_with_feedback(v, KEY)
    assert fused is not None
    with pytest.raises(NonFiniteInputError):
        fused[0].verify()
    assert torch.equal(v, before)
