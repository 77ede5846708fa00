"""``dqsg-table1``: Table 1 of the DQSG paper (raw Kbit per worker per iteration) from the real
compressors, via :func:`.bit_counts.table1`. It needs no training, so ``--quick`` and the
full run are the same computation."""

from __future__ import annotations

from pathlib import Path

from gradzip_lab.reproduce.dqsg.bit_counts import table1
from gradzip_lab.reproduce.outcome import Outcome, Row


def run(out: Path, quick: bool) -> Outcome:
    cells = table1()
    rows = [Row(f"{c.model} {c.method}", c.paper_kbits, c.kbits, "Kbit") for c in cells]
    return Outcome(
        id="dqsg-table1",
        title="DQSG paper, Table 1: raw Kbit per worker per iteration",
        quick=quick,
        rows=rows,
        scaled_down=[
            "Nothing: the counts depend only on the parameter shapes, so every cell is computed "
            "in full by encoding one standard-normal tensor per parameter of each model with the "
            "registered compressor and summing the paper_bits the payloads report.",
        ],
        notes=[
            "1 Kbit = 1000 bits. Columns: identity (Baseline), dqsg M=1, qsgd s=1 with the max "
            "norm (the paper's QSG), terngrad, onebit with one (mu+, mu-) pair per row; the last "
            "row is the DQSG M=2 figure quoted beside the NDQSG experiment.",
            "TernGrad is counted as QSG with M=1 (n*log2(3) + 32 per tensor); the paper's "
            "TernGrad figures are 0.17-0.81% higher for FC-300-100 and LeNet and no per-tensor "
            "overhead rule fits all three models, so the FC-300-100 TernGrad cell is not "
            "reproduced (the paper does not say what the extra bits are). The authors' public "
            "code cannot settle it: its TernGrad quantizer (no clipping, one scale) sends "
            "exactly n*log2(3) + 32 per tensor, and none of its scripts counts TernGrad's bits.",
            "The CifarNet DQSGD/QSGD and One-Bit cells are 0.21% above the paper while its "
            "baseline is exact: the same factor on both, most likely a rounding or averaging "
            "artefact in the paper's figures rather than a different rule.",
        ],
        extra={"cells": [{"model": c.model, "method": c.method, "codec": c.codec} for c in cells]},
    )
