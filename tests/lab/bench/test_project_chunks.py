"""The scaling model of the integer all-reduce's chunks, and stored rows scored as the
variant they ran (one chunk, before chunks became the default)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gradzip.schemes.spec import ExchangeSpec
from gradzip_lab.bench.project_links import Link
from gradzip_lab.bench.project_rings import pipelined_seconds
from gradzip_lab.bench.project_validate import MeasuredRow, as_measured, overlaps_codec
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
    assert four.comm_s > four.codec_s  # link-bound: the codec hides but for one chunk
    assert four.step_s == pytest.approx(longer + shorter / 4)
    assert four.step_s < one.step_s


def test_a_codec_bound_pipeline_hides_the_bytes_but_not_the_collectives_latency() -> None:
    """When the codec outlasts the transfers, the step waits for the codec, a quarter of the
    bytes' seconds (the fill) and every round's alpha: the latency is paid apart (on the
    measured cluster it is the wait for ranks sharing cores to be scheduled)."""
    work = Workload([torch.Size([1 << 22])], compute_s=0.0)
    spec = str(ExchangeSpec.parse("gradzip:qsgd:allreduce[chunk_values=1048576]"))
    work.given_speeds["qsgd"] = (1e-8, 1e-8)
    work._timed[f"{SCHEME_CPU}4:{spec}"] = 3e-7  # 1.26 s of codec, far over the link's
    alpha = 2e-3
    link = Link(alpha_s=alpha, gbit_per_s=1.0, efficiency=EXACT)
    four = predict(spec, work, 4, Network(link, link))
    rounds = 4 * 2 * 3  # four chunks, each an all-to-all and an all-gather of 3 messages
    latency = rounds * alpha
    transfer = four.comm_s - latency
    assert four.codec_s > four.comm_s > latency > 0
    assert four.step_s == pytest.approx(latency + four.codec_s + transfer / 4)
    # hiding the latency too would have predicted the step shorter by three quarters of it
    assert four.step_s - (four.codec_s + four.comm_s / 4) == pytest.approx(0.75 * latency)
    with pytest.raises(ValueError, match="at least one stage"):
        pipelined_seconds(0.0, 1.0, 1.0, 0)


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


@pytest.mark.parametrize(
    "spec",
    [
        "gradzip:qsgd:allreduce",
        "gradzip:qsgd:allgather",
        "gradzip:qsgd:ring_allreduce[chunk_values=65536]",
    ],
)
def test_a_rank_without_a_spare_core_adds_its_codec_to_its_link_time(spec: str) -> None:
    """``overlap_codec=False`` (a row whose ranks had under two cores each): every pipelined
    scheme waits for its codec plus its link, the same seconds and bytes otherwise."""
    shapes = [torch.Size([1 << 21]), torch.Size([1 << 21])]
    work = Workload(shapes, compute_s=0.0, cpu_share=0.5)
    work.given_speeds["qsgd"] = (1e-8, 1e-8)
    text = str(ExchangeSpec.parse(spec))
    work._timed[f"{SCHEME_CPU}4:{text}"] = 3e-8
    work._hops[2] = (1e-9, 1e-9)  # the ring's hop passes, as a speeds file gives them
    link = Link(alpha_s=1e-4, gbit_per_s=1.0, efficiency=EXACT)
    net = Network(link, link)
    overlapped = predict(text, work, 4, net)
    added = predict(text, replace(work, overlap_codec=False), 4, net)
    assert (added.comm_s, added.codec_s) == (overlapped.comm_s, overlapped.codec_s)
    assert added.bytes_per_rank == overlapped.bytes_per_rank
    assert added.step_s == pytest.approx(added.comm_s + added.codec_s)
    assert overlapped.step_s < added.step_s


def _row(world_size: int, cpu_count: int) -> MeasuredRow:
    return MeasuredRow("f.json", "mlp-4096", world_size, "1gbit", 10**9, "fp32", 1.0, None,
                       None, cpu_count)  # fmt: skip


def test_the_validation_overlaps_the_codec_only_where_a_rank_had_two_cores() -> None:
    assert not overlaps_codec(_row(2, 2))  # the emulated cluster: a core a rank at most
    assert not overlaps_codec(_row(8, 2))
    assert overlaps_codec(_row(4, 8))
    assert overlaps_codec(_row(4, 0))  # the file does not say: the projection's assumption
