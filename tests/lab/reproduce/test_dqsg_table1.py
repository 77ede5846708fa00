"""Table 1 of the DQSG paper (seed 000) rebuilt from parameter shapes by the real compressors."""

from __future__ import annotations

import math

import pytest

import gradzip
from gradzip.models.shapes import MODEL_SHAPES, parameter_count
from gradzip_lab.reproduce.dqsg.bit_counts import (
    DQSG_M2,
    PAPER_TABLE1,
    TABLE1_METHODS,
    Method,
    Table1Row,
    format_table1,
    model_paper_bits,
    table1_cell,
    table1_cells,
)

# spec 6.6: every cell within 0.25% of the paper
TOLERANCE = 0.0025


def _need(codec: str) -> None:
    # a compressor dropping out of the registry must fail these tests, not skip them
    assert codec in gradzip.names(), f"compressor {codec!r} is not registered"


# The paper's FC-300-100 TernGrad figure (426.2) exceeds n*log2(3) + 32*#tensors = 422.76 by
# 0.81%, and no shape-only rule (extra scalars per tensor, per layer, per row or column, per
# element, or per fixed-size bucket) also keeps LeNet and CifarNet within 0.25%; see
# test_terngrad_gap_has_no_per_tensor_explanation and docs/reproduction.md (DQSG, Table 1). The
# authors' public code does not explain it either: its TernGrad quantizer (no clipping, one scale)
# sends exactly n*log2(3) + 32 per tensor, and no script of theirs counts TernGrad's bits.
TERNGRAD_FC_XFAIL = pytest.mark.xfail(
    strict=True,
    reason="paper's FC-300-100 TernGrad 426.2 Kbit is 0.81% above n*log2(3) + 32*#tensors; "
    "no principled shape-only rule reproduces it together with LeNet and CifarNet, and the "
    "authors' TernGrad quantizer sends exactly that count",
)
CELLS = [
    pytest.param(
        model,
        method,
        id=f"{model}/{method.label}",
        marks=TERNGRAD_FC_XFAIL if (model, method.label) == ("FC-300-100", "TernGrad") else (),
    )
    for model, method in table1_cells()
]


@pytest.mark.parametrize(
    ("model", "count"), [("FC-300-100", 266_610), ("LeNet", 1_663_370), ("CifarNet", 1_068_298)]
)
def test_parameter_counts(model: str, count: int) -> None:
    assert parameter_count(MODEL_SHAPES[model]) == count


def test_baseline_is_32_bits_per_parameter() -> None:
    for model, shapes in MODEL_SHAPES.items():
        row = table1_cell(model, TABLE1_METHODS[0])
        assert row.kbits * 1000 == 32 * parameter_count(shapes)


@pytest.mark.parametrize(("model", "method"), CELLS)
def test_cell_matches_paper(model: str, method: Method) -> None:
    _need(method.codec)
    row = table1_cell(model, method)
    assert abs(row.rel_diff) <= TOLERANCE, format_table1([row])


def test_fc_dqsg_m2_is_619_2_kbit() -> None:
    _need("dqsg")
    row = table1_cell("FC-300-100", DQSG_M2)
    # 266610*log2(5) + 6*32 = 619.24K, quoted as 619.2
    assert row.kbits == pytest.approx(619.2, abs=0.05)


@pytest.mark.parametrize("model", list(MODEL_SHAPES))
def test_dqsg_closed_form(model: str) -> None:
    """``n*log2(2M+1) + 32*#tensors`` (spec 1.2), independent of the data."""
    _need("dqsg")
    shapes = MODEL_SHAPES[model]
    n = parameter_count(shapes)
    for M in (1, 2):
        bits = model_paper_bits("dqsg", {"M": M}, shapes, seed=M)
        assert bits == pytest.approx(n * math.log2(2 * M + 1) + 32 * len(shapes), abs=1e-3)


@pytest.mark.parametrize("model", list(MODEL_SHAPES))
def test_onebit_closed_form_groups_by_first_dimension(model: str) -> None:
    """``n + 64*#groups``: one (mu+, mu-) pair per first-dimension slice, one per bias (1.9)."""
    _need("onebit")
    shapes = MODEL_SHAPES[model]
    groups = sum(shape[0] if len(shape) > 1 else 1 for shape in shapes)
    bits = model_paper_bits("onebit", {}, shapes)
    assert bits == parameter_count(shapes) + 64 * groups


def test_onebit_layout_matters() -> None:
    """The PyTorch ``[out, in]`` layout gives other groups and misses the paper by far."""
    _need("onebit")
    torch_layout = [tuple(reversed(s)) if len(s) == 2 else s for s in MODEL_SHAPES["FC-300-100"]]
    bits = model_paper_bits("onebit", {}, torch_layout)
    assert abs(bits / 1000 / PAPER_TABLE1["FC-300-100", "One-Bit"] - 1) > 10 * TOLERANCE


def test_format_table1_lists_every_cell() -> None:
    rows = [
        Table1Row("FC-300-100", "DQSGD", "dqsg(M=1)", 422.76, 422.8),
        Table1Row("LeNet", "One-Bit", "onebit()", 1897.74, 1897.8),
    ]
    text = format_table1(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)
    assert "422.8" in lines[2] and "-0.01%" in lines[2] and "dqsg(M=1)" in lines[2]
    assert "1897.7" in lines[3] and "1897.8" in lines[3]


def test_paper_numbers_cover_every_cell() -> None:
    assert {(m, meth.label) for m, meth in table1_cells()} == set(PAPER_TABLE1)


def test_terngrad_gap_has_no_per_tensor_explanation() -> None:
    """The paper's TernGrad excess over ``n*log2(3) + 32*T`` cannot be ``c`` extra bits per tensor.

    Within 0.25%, FC-300-100 needs ``c >= 427`` bits per tensor while CifarNet allows at most
    ``c <= 299``: the intervals are disjoint, so no per-tensor (or per-layer: twice as wide, same
    contradiction) overhead reproduces the column.
    """
    lows, highs = [], []
    for model in ("FC-300-100", "CifarNet"):
        shapes = MODEL_SHAPES[model]
        plain = parameter_count(shapes) * math.log2(3) + 32 * len(shapes)
        paper = 1000 * PAPER_TABLE1[model, "TernGrad"]
        lows.append((paper * (1 - TOLERANCE) - plain) / len(shapes))
        highs.append((paper * (1 + TOLERANCE) - plain) / len(shapes))
    assert lows[0] > highs[1]
