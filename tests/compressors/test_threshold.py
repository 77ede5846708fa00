"""Threshold quantization (spec 5.2, 5.5): reconstruction, unsent entries, wire formats, EF."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gradzip.compressors._groups as groups_module
from gradzip.compressors.threshold import Threshold
from gradzip.feedback import ErrorFeedback
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload

KEY = StreamKey(run_seed=8, rank=0, step=1, tensor_index=3)
CODINGS = [{}, {"coding": "golomb_rice"}, {"coding": "golomb_rice", "rice_k": "auto"}]


def reference(x: torch.Tensor, tau: float) -> torch.Tensor:
    t = float(np.float32(tau))
    return torch.where(x >= t, t, torch.where(x <= -t, -t, 0.0)).float()


@pytest.mark.parametrize("kw", CODINGS)
@pytest.mark.parametrize("shape", [(), (1,), (999,), (31, 17, 3)])
def test_reconstruction_and_unsent_entries(kw: dict[str, object], shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    tau = 0.7
    comp = Threshold(tau, **kw)  # type: ignore[arg-type]
    enc, y = comp.round_trip(x, KEY)
    assert torch.equal(y, reference(x, tau))
    nnz = int((x.abs() >= np.float32(tau)).sum())
    assert enc.paper_bits == 32 * nnz
    header, body = parse_payload(enc.payload)
    assert 8 * len(body) == comp.expected_body_bits(x)
    assert enc.wire_bits == overhead_bits(header) + comp.expected_body_bits(x)


def test_ties_at_tau_are_sent_and_tau_is_float32() -> None:
    tau = 0.1  # not a float32 number: the float32 value is the threshold and the level
    t32 = float(np.float32(tau))
    below = float(np.nextafter(np.float32(tau), np.float32(0)))
    x = torch.tensor([t32, -t32, below, -below, 0.0, 5.0])
    _, y = Threshold(tau).round_trip(x, KEY)
    assert y.tolist() == [t32, -t32, 0.0, 0.0, 0.0, t32]


def test_uint32_wire_format() -> None:
    x = torch.tensor([0.0, 2.0, -3.0, 0.5, -0.5, 1.0])
    enc = Threshold(1.0).encode(x, KEY)
    _, body = parse_payload(enc.payload)
    words = np.frombuffer(body, dtype="<u4").tolist()
    assert words == [(1 << 1) | 1, (2 << 1) | 0, (5 << 1) | 1]


def test_nothing_sent() -> None:
    x = torch.full((50,), 0.01)
    for kw, body_bytes in zip(CODINGS, (0, 4, 8), strict=True):
        comp = Threshold(1.0, **kw)  # type: ignore[arg-type]
        enc, y = comp.round_trip(x, KEY)
        assert len(parse_payload(enc.payload)[1]) == body_bytes
        assert comp.expected_body_bits(x) == 8 * body_bytes
        assert bool((y == 0).all()) and enc.paper_bits == 0


def test_golomb_rice_is_smaller_on_sparse_outputs() -> None:
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(2))
    plain = Threshold(3.0).encode(x, KEY)
    coded = Threshold(3.0, coding="golomb_rice", rice_k="auto").encode(x, KEY)
    # ~270 entries with mean gap ~370: Rice coding needs ~2 + log2(370) ~ 11 bits per entry
    assert 8 * len(parse_payload(coded.payload)[1]) < 0.45 * plain.paper_bits


def test_invalid_parameters_and_index_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-50, 1e39):
        with pytest.raises(ValueError, match="tau"):
            Threshold(bad)
    with pytest.raises(ValueError, match="coding"):
        Threshold(1.0, coding="zip")
    with pytest.raises(ValueError, match="rice_k"):
        Threshold(1.0, coding="golomb_rice", rice_k=32)
    monkeypatch.setattr(groups_module, "INDEX_LIMIT", 100)
    x = torch.zeros(200)
    x[150] = 5.0
    with pytest.raises(ValueError, match="31-bit index"):
        Threshold(1.0).encode(x, KEY)
    Threshold(1.0, coding="golomb_rice").encode(x, KEY)  # no index limit there


@pytest.mark.parametrize("kw", CODINGS[:2])
def test_error_feedback_telescopes_and_keeps_unsent_entries(kw: dict[str, object]) -> None:
    """Spec 0.6 and 5.2: sum_t v_hat_t = sum_t g_t - e_T; unsent entries keep all of V."""
    gen = torch.Generator().manual_seed(3)
    comp = Threshold(1.5, **kw)  # type: ignore[arg-type]
    ef = ErrorFeedback(comp)
    e = torch.zeros(40, 25)
    total_g = torch.zeros(40, 25, dtype=torch.float64)
    total_hat = torch.zeros_like(total_g)
    for t in range(25):
        g = torch.randn(40, 25, generator=gen) * 0.5
        v = g + e
        key = KEY.with_step(t)
        _, v_hat = comp.round_trip(v, key)
        ef_enc = ef.encode(g, key)
        assert torch.equal(ef.decode(ef_enc.payload, expected_key=key), v_hat)
        unsent = v_hat == 0
        e = v - v_hat
        assert torch.equal(e[unsent], v[unsent])
        assert float(e[unsent].abs().max()) < 1.5  # an entry at or past tau is sent
        total_g += g
        total_hat += v_hat.double()
    assert torch.allclose(total_hat, total_g - e.double(), atol=1e-4, rtol=0)
    assert torch.equal(ef.residual(KEY.tensor_index), e)


def test_contraction_and_entropy_bits() -> None:
    x = torch.randn(4000, generator=torch.Generator().manual_seed(4)).double()
    tau = 1.25
    enc, y = Threshold(tau).round_trip(x.float(), KEY)
    x, y = x.float().double(), y.double()
    sent = y != 0
    err = float(((x - y) ** 2).sum())
    expected = float((x[~sent] ** 2).sum() + ((x[sent].abs() - tau) ** 2).sum())
    assert math.isclose(err, expected, rel_tol=1e-9)
    assert err <= float((x**2).sum()) - int(sent.sum()) * tau**2
    # entropy_bits: n*H of the ternary symbols (unsent, -tau, +tau); no side data
    counts = [int((~sent).sum()), int((y < 0).sum()), int((y > 0).sum())]
    n = sum(counts)
    n_h = n * math.log2(n) - sum(c * math.log2(c) for c in counts if c)
    assert math.isclose(enc.entropy_bits, n_h, rel_tol=1e-9)
