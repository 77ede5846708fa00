"""The scaling model of the integer all-reduce's chunks, and stored rows scored as the
variant they ran (one chunk, before chunks became the default)."""

from __future__ import annotations

import pytest
import torch

from gradzip.schemes.spec import ExchangeSpec
from gradzip_lab.bench.project_links import Link
from gradzip_lab.bench.project_validate import as_measured
from gradzip_lab.bench.project_variants import SCHEME_CPU, Network, Workload, predict

EXACT = 1.0  # a link without framing overhead


def test_chunks_overlap_the_codec_with_the_link_and_cost_their_rounds() -> None:
    """One bucket of 4 Mi values in chunks of 1 Mi: four times the rounds of one chunk, and a
    step that waits for ``max(comm, codec) + min(comm, codec) / 4`` instead of their sum."""
    work = Workload([torch.Size([1 << 22])], compute_s=0.0)
    work.given_speeds["qsgd"] = (1e-8, 1e-8)
    specs = [
        f"gradzip:qsgd:allreduce{o}" for o in ("[chunk_values=none]", "[chunk_values=1048576]", "")
    ]
    for spec in specs:  # the scheme's CPU, as a speeds file gives it: one figure for all three
        work._timed[f"{SCHEME_CPU}4:{ExchangeSpec.parse(spec)}"] = 3e-8
    link = Link(alpha_s=1e-3, gbit_per_s=0.1, efficiency=EXACT)
    net = Network(link, link)
    one, four, default = (predict(spec, work, 4, net) for spec in specs)
    assert default.step_s == four.step_s
    assert one.bytes_per_rank == four.bytes_per_rank
    # the same codec and bytes; 6 rounds a chunk (3 each way) cost alpha each
    comm_one = one.comm_s
    assert four.comm_s == pytest.approx(comm_one + 3 * 6 * 1e-3)
    assert one.step_s == pytest.approx(one.comm_s + one.codec_s)
    longer, shorter = max(four.comm_s, four.codec_s), min(four.comm_s, four.codec_s)
    assert four.step_s == pytest.approx(longer + shorter / 4)
    assert four.step_s < one.step_s


def test_rows_measured_before_the_chunked_default_are_scored_as_one_chunk() -> None:
    before, after = "2026-11-29T08:53:05+00:00", "2026-11-29T15:10:00+00:00"
    assert as_measured("gradzip:qsgd:allreduce", before) == (
        "gradzip:qsgd:allreduce[chunk_values=null]"
    )
    assert as_measured("gradzip:qsgd[s=16]+ef:allreduce", "") == (
        "gradzip:qsgd[s=16]+ef:allreduce[chunk_values=null]"
    )
    assert as_measured("gradzip:qsgd:allreduce", after) == "gradzip:qsgd:allreduce"
    spelled = "gradzip:qsgd:allreduce[chunk_values=4]"
    assert as_measured(spelled, before) == spelled
    assert as_measured("gradzip:qsgd:allgather", before) == "gradzip:qsgd:allgather"
    assert as_measured("fp32", before) == "fp32"
