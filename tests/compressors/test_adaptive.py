"""Adaptive quantization (spec 5.3-5.5): per-column selection, ties, sampling, wire, EF."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gradzip.compressors.adaptive as adaptive_module
from gradzip.compressors.adaptive import Adaptive
from gradzip.feedback import ErrorFeedback
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload

KEY = StreamKey(run_seed=3, rank=1, step=7, tensor_index=4)


def columns(x: torch.Tensor, group: str) -> torch.Tensor:
    if x.dim() <= 1:
        return x.reshape(1, -1)
    a = x.reshape(x.shape[0], -1)
    return a if group == "out" else a.t()


def reference_column(v: torch.Tensor, p: int) -> tuple[torch.Tensor, int, int]:
    """Spec 5.3 for one column, written plainly: (reconstruction, n+, n-); exact zeros are in
    neither set (the documented [CHOICE])."""
    out = torch.zeros_like(v)
    pos, neg = v[v > 0], v[v < 0]
    n_pos = max(1, len(pos) // p) if len(pos) else 0
    n_neg = max(1, len(neg) // p) if len(neg) else 0
    if n_pos:
        top = pos.sort(descending=True).values[:n_pos]
        out[v >= top[-1]] = float(top.double().mean())
    if n_neg:
        bottom = neg.sort().values[:n_neg]
        out[v <= bottom[-1]] = float(bottom.double().mean())
    return out, n_pos, n_neg


def header_means(comp: Adaptive, x: torch.Tensor, key: StreamKey = KEY) -> torch.Tensor:
    _, body = parse_payload(comp.encode(x, key).payload)
    cols = columns(x, comp.group).shape[0]
    per = 3 if comp.zero_mean else 2
    return torch.from_numpy(
        np.frombuffer(body[: 4 * per * cols], dtype="<f4").reshape(cols, per).copy()
    )


@pytest.mark.parametrize("group", ["out", "in"])
@pytest.mark.parametrize("p", [1, 3, 32])
@pytest.mark.parametrize("shape", [(), (1,), (300,), (17, 40), (6, 5, 9)])
def test_matches_reference_counts_and_sums(group: str, p: int, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(p)) + 0.3
    comp = Adaptive(proportion=p, group=group)
    enc, y = comp.round_trip(x, KEY)
    cx, cy = columns(x, group), columns(y, group)
    nnz = 0
    for c in range(cx.shape[0]):
        ref, n_pos, n_neg = reference_column(cx[c], p)
        assert torch.allclose(cy[c], ref, rtol=1e-6, atol=0)
        sent = cy[c] != 0
        assert int(sent.sum()) == n_pos + n_neg  # no ties in continuous data
        # the sent reconstructions sum to the sent values, for each sign separately
        for side in (cx[c] >= 0, cx[c] < 0):
            s = sent & side
            assert math.isclose(
                float(cy[c][s].double().sum()), float(cx[c][s].double().sum()),
                rel_tol=1e-6, abs_tol=1e-6,
            )  # fmt: skip
        nnz += int(sent.sum())
    cols = cx.shape[0]
    assert enc.paper_bits == 64 * cols + 32 * nnz
    header, body = parse_payload(enc.payload)
    assert 8 * len(body) == 64 * cols + 32 * nnz == comp.expected_body_bits(x)
    assert enc.wire_bits == overhead_bits(header) + comp.expected_body_bits(x)


def test_ties_at_the_threshold_are_all_sent() -> None:
    x = torch.tensor([[5.0, 5.0, 5.0, 1.0, 2.0, 0.5, -1.0, -2.0, -2.0, -0.5]])
    # 6 non-negative, p=4 -> n+ = 1: tau+ = 5, every 5 is sent; 4 negative -> n- = 1, tau- = -2
    _, y = Adaptive(proportion=4).round_trip(x, KEY)
    assert y.tolist() == [[5.0, 5.0, 5.0, 0, 0, 0, 0, -2.0, -2.0, 0]]


def test_empty_positive_or_negative_sets() -> None:
    x = torch.tensor([[-1.0, -3.0, -2.0, -6.0], [1.0, 0.0, 5.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    comp = Adaptive(proportion=2)
    _, y = comp.round_trip(x, KEY)
    # row 0: no positives -> mu+ = 0, only the 2 smallest sent; row 1: no negatives, three
    # positives -> n+ = 1; row 2: zeros are in neither set, so nothing is sent
    assert y.tolist() == [[0, -4.5, 0, -4.5], [0, 0, 5.0, 0], [0, 0, 0, 0]]
    assert header_means(comp, x).tolist() == [[0.0, -4.5], [5.0, 0.0], [0.0, 0.0]]


def test_zeros_are_never_sent() -> None:
    """A sparse column (a ReLU gradient): the zeros must not all go out as mu+."""
    x = torch.zeros(10_000)
    x[::500] = torch.arange(1, 21, dtype=torch.float32)
    comp = Adaptive(proportion=4)
    enc, y = comp.round_trip(x, KEY)
    assert int((y != 0).sum()) == 5  # n+ = 20 // 4 of the 20 non-zero entries
    assert enc.paper_bits == 64 + 32 * 5
    assert Adaptive().encode(torch.zeros(64, 64), KEY).paper_bits == 64 * 64


def test_wire_layout() -> None:
    x = torch.tensor([[3.0, -1.0, 0.5, -4.0], [-2.0, 1.0, 0.25, 7.0]])
    enc = Adaptive(proportion=2).encode(x, KEY)
    _, body = parse_payload(enc.payload)
    assert np.frombuffer(body[:16], dtype="<f4").tolist() == [3.0, -4.0, 7.0, -2.0]
    words = np.frombuffer(body[16:], dtype="<u4").tolist()
    assert words == [(0 << 1) | 1, (3 << 1) | 0, (4 << 1) | 0, (7 << 1) | 1]


@pytest.mark.parametrize(
    "kw",
    [
        {"coding": "golomb_rice"},
        {"coding": "golomb_rice", "rice_k": "auto"},
        {"zero_mean": True},
        {"sample": True},
        {"sample": True, "group": "in", "coding": "golomb_rice"},
    ],
)
def test_expected_body_bits_for_every_option(kw: dict[str, object]) -> None:
    x = torch.randn(150, 300, generator=torch.Generator().manual_seed(9))
    comp = Adaptive(proportion=8, **kw)  # type: ignore[arg-type]
    for key in (KEY, KEY.with_step(8)):
        enc, y = comp.round_trip(x, key)
        header, body = parse_payload(enc.payload)
        assert 8 * len(body) == comp.expected_body_bits(x, key)
        assert enc.wire_bits == overhead_bits(header) + comp.expected_body_bits(x, key)
    _, y_plain = Adaptive(proportion=8, sample=bool(kw.get("sample"))).round_trip(x, key)
    if not kw.get("zero_mean") and kw.get("group") is None:
        assert torch.equal(y, y_plain)  # coding changes the bytes, never the values


def test_zero_mean_preserves_column_sums() -> None:
    x = torch.randn(30, 200, generator=torch.Generator().manual_seed(10)) + 0.2
    comp = Adaptive(proportion=16, zero_mean=True)
    enc, y = comp.round_trip(x, KEY)
    plain = Adaptive(proportion=16).round_trip(x, KEY)[1]
    sent = plain != 0
    unsent_mean = torch.where(sent, 0.0, x).sum(1, dtype=torch.float64) / (~sent).sum(1)
    assert torch.allclose(header_means(comp, x)[:, 2].double(), unsent_mean, rtol=1e-6)
    assert torch.equal(y[sent], plain[sent])
    assert torch.allclose(y.double().sum(1), x.double().sum(1), rtol=0, atol=1e-4)
    assert enc.paper_bits == 96 * 30 + 32 * int(sent.sum())


def test_sampling_equals_exact_statistics_when_rows_fit() -> None:
    x = torch.randn(20, 128, generator=torch.Generator().manual_seed(11))
    exact = Adaptive(proportion=8).round_trip(x, KEY)[1]
    assert torch.equal(Adaptive(proportion=8, sample=True).round_trip(x, KEY)[1], exact)


def test_sampled_statistics_converge_as_the_sample_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    """With p = 4 a side keeps its top 1/8 of the column: tau+ is the 7/8 quantile of N(0,1)
    (x = 1.15, density 0.206, so its standard error is sqrt(7/64/s)/0.206 = 1.6/sqrt(s)) and the
    tail mean 1.65 has standard error about sqrt(var_tail * 8 / s) + that of tau, < 2.5/sqrt(s).
    Every column is within 5 standard errors, and the worst error shrinks."""
    x = torch.randn(40, 4096, generator=torch.Generator().manual_seed(12))
    exact = header_means(Adaptive(proportion=4), x).double()
    worst = []
    for size in (128, 512, 2048):
        monkeypatch.setattr(adaptive_module, "SAMPLE_ROWS", size)
        est = header_means(Adaptive(proportion=4, sample=True), x).double()
        err = (est - exact).abs()
        assert bool((err < 5 * 2.5 / math.sqrt(size)).all()), (size, float(err.max()))
        worst.append(float(err.max()))
    assert worst[0] > worst[1] > worst[2]


def test_sampled_means_track_the_whole_column() -> None:
    """The sampled mu+- are the top-n means of 128 draws with replacement: consistent, with a
    small-sample bias of order 1/s (about 2/128 here). Over 1000 columns whose rows are not
    exchangeable (a ramp along the rows), the mean error is within 5 standard errors plus that
    bias; sampling only part of each column would miss by ~0.15-0.5."""
    cols, s = 1000, adaptive_module.SAMPLE_ROWS
    ramp = torch.linspace(-1, 1, 1024)
    x = torch.randn(cols, 1024, generator=torch.Generator().manual_seed(13)) + ramp
    exact = header_means(Adaptive(proportion=4), x).double()
    est = header_means(Adaptive(proportion=4, sample=True), x).double()
    err = est - exact
    tol = 5 * err.std(dim=0) / math.sqrt(cols) + 2 / s
    assert bool((err.mean(dim=0).abs() < tol).all()), (err.mean(dim=0), tol)


@pytest.mark.parametrize("kw", [{}, {"group": "in", "coding": "golomb_rice"}, {"sample": True}])
def test_error_feedback_telescopes(kw: dict[str, object]) -> None:
    gen = torch.Generator().manual_seed(14)
    comp = Adaptive(proportion=8, **kw)  # type: ignore[arg-type]
    ef = ErrorFeedback(comp)
    e = torch.zeros(24, 160)
    total_g = torch.zeros(24, 160, dtype=torch.float64)
    total_hat = torch.zeros_like(total_g)
    for t in range(25):
        g = torch.randn(24, 160, generator=gen)
        v = g + e
        key = KEY.with_step(t)
        _, v_hat = comp.round_trip(v, key)
        enc = ef.encode(g, key)
        assert torch.equal(ef.decode(enc.payload, expected_key=key), v_hat)
        e = v - v_hat
        total_g += g
        total_hat += v_hat.double()
    assert torch.allclose(total_hat, total_g - e.double(), atol=1e-4, rtol=0)
    assert torch.equal(ef.residual(KEY.tensor_index), e)


def test_invalid_parameters() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="proportion"):
            Adaptive(proportion=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group"):
        Adaptive(group="rows")
    with pytest.raises(ValueError, match="coding"):
        Adaptive(coding="lz4")


def test_contraction_identity_and_entropy_bits() -> None:
    x = torch.randn(40, 90, generator=torch.Generator().manual_seed(15))
    comp = Adaptive(proportion=5)
    enc, y = comp.round_trip(x, KEY)
    means = header_means(comp, x).double()
    xd, yd = x.double(), y.double()
    n_pos = (yd == means[:, :1]).logical_and(xd >= 0).sum(dim=1).double()
    n_neg = (yd == means[:, 1:2]).logical_and(xd < 0).sum(dim=1).double()
    kept = (n_pos * means[:, 0] ** 2 + n_neg * means[:, 1] ** 2).sum()
    err = float(((xd - yd) ** 2).sum())
    assert math.isclose(err, float((xd**2).sum() - kept), rel_tol=1e-5)
    nnz = int((y != 0).sum())
    counts = [x.numel() - nnz, int(n_neg.sum()), int(n_pos.sum())]
    n_h = x.numel() * math.log2(x.numel()) - sum(c * math.log2(c) for c in counts if c)
    assert math.isclose(enc.entropy_bits, n_h + 64 * 40, rel_tol=1e-9)
