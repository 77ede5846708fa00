"""The projection of ``ring_allreduce`` and ``hierarchical`` against the real schemes: the bytes
the model predicts a rank sends are the bytes the transport's meter counts (running the schemes
over :class:`~gradzip.comm.local.LocalTransport`), and the pipeline's overlap on a hand-made case.

Codec speeds are given, never timed, so every figure is deterministic."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.comm.local import run_local
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.schemes._messages import pack_floats
from gradzip.schemes.spec import ExchangeSpec
from gradzip_lab.bench.project import ranks_per_node, spans_nodes
from gradzip_lab.bench.project_links import Link
from gradzip_lab.bench.project_rings import NODE_KEY, SCALE_KEY, RingSizes
from gradzip_lab.bench.project_variants import Network, Workload, predict

#: the model's stream key has this run seed (a 2-byte varint, as here): the real messages'
#: headers then have the model's sizes (every other key field stays below 128 here)
RUN_SEED = 2024
#: a link without framing overhead or latency: the prediction's seconds are bytes / 1e9
EXACT = Link(alpha_s=0.0, gbit_per_s=8.0, efficiency=1.0)
SHAPES = [torch.Size([40, 75]), torch.Size([75])]  # 3000 + 75 values, two tensors


def _metered(spec: str, world_size: int) -> int:
    """The most bytes any rank sent (the meter's count, length prefixes included)."""

    def run(t: Transport) -> int:
        scheme = ExchangeSpec.parse(spec).build(run_seed=RUN_SEED)
        for index, shape in enumerate(SHAPES):
            gen = torch.Generator().manual_seed(100 * index + t.rank)
            scheme.reduce(t, torch.randn(shape, generator=gen), 0, index)
        return int(t.meter.total(step=0).sent)

    return max(run_local(world_size, run))


def _work() -> Workload:
    work = Workload(list(SHAPES), compute_s=0.0)
    work.given_speeds["qsgd"] = work.given_speeds["ring-hop"] = (0.0, 0.0)
    return work


def _rounds(spec: str, p: int) -> int:
    """The messages a rank sends according to the model (its rounds), from the same sizes."""
    scheme = ExchangeSpec.parse(spec).build(run_seed=0)
    inner = getattr(scheme, "inner", scheme)
    k = getattr(scheme, "ranks_per_node", None) or 1
    sizes = RingSizes(inner)
    rounds = 0
    for shape in SHAPES:
        rounds += k - 1  # the leader's float32 messages down to its node
        if p // k > 1:
            t = sizes.tensor(int(shape.numel()), p // k)
            rounds += int(t.scales.rounds + t.codes.rounds)
    return rounds


@pytest.mark.parametrize(
    ("spec", "world_size"),
    [
        ("gradzip:qsgd:ring_allreduce[chunk_values=256]", 2),
        ("gradzip:qsgd:ring_allreduce[chunk_values=256]", 4),
        ("gradzip:qsgd:ring_allreduce[chunk_values=256]", 8),
        ("gradzip:qsgd:ring_allreduce", 8),
        ("gradzip:qsgd:hierarchical[ranks_per_node=2,chunk_values=256]", 4),
        ("gradzip:qsgd:hierarchical[ranks_per_node=2,chunk_values=256]", 8),
        ("gradzip:qsgd:hierarchical[ranks_per_node=4]", 8),
    ],
)
def test_predicted_bytes_are_the_meters(spec: str, world_size: int) -> None:
    predicted = predict(spec, _work(), world_size, Network(EXACT, EXACT)).bytes_per_rank
    rounds = _rounds(spec, world_size)
    measured = _metered(spec, world_size) - LENGTH_PREFIX_BYTES * rounds
    # Every model message has the size of the longest slice's: a real one may hold a value
    # fewer (a byte fewer of codes at 2 bits, 4 of scales), and its header's shape varint may be
    # a byte shorter. So the model may exceed the meter by at most 4 + 1 bytes a message and
    # never fall short; one ceil(log2 P) bit more a code would add >= 1/2 of the codes' bytes.
    assert 0 <= predicted - measured <= 5 * rounds
    assert predicted - measured < 0.1 * measured


def test_the_rings_bytes_do_not_grow_with_the_world_size_like_allreduces() -> None:
    work = Workload([torch.Size([1 << 20])], compute_s=0.0)
    work.given_speeds["qsgd"] = work.given_speeds["ring-hop"] = (0.0, 0.0)
    net = Network(EXACT, EXACT)
    ring = [predict("gradzip:qsgd:ring_allreduce", work, p, net).bytes_per_rank for p in (2, 64)]
    integer = predict("gradzip:qsgd:allreduce", work, 64, net).bytes_per_rank
    # 2(P-1)/P of one payload: P = 64 sends 63/32 of P = 2's bytes, plus a header for each
    # of its 2 x 126 messages (codes and scales); allreduce's codes widen by ceil(log2 64) bits
    header = len(pack_floats(torch.zeros(0), SCALE_KEY))
    assert 63 / 32 * ring[0] < ring[1] <= 63 / 32 * ring[0] + 2 * 126 * header
    assert ring[1] < 0.5 * integer


def test_the_pipeline_hides_the_smaller_of_link_and_codec_but_one_stage() -> None:
    # one tensor of 2**16 values, chunks of 2**10: at P = 2, 32 chunks a slice
    work = Workload([torch.Size([1 << 16])], compute_s=0.0)
    codec_s, pack_s, add_s = 1e-6, 2e-7, 1e-7  # seconds a value
    work.given_speeds["qsgd"] = (codec_s, codec_s)
    work.given_speeds["ring-hop"] = (pack_s, add_s)
    link = Link(alpha_s=0.0, gbit_per_s=8e-3, efficiency=1.0)  # 1e6 bytes a second
    pred = predict("gradzip:qsgd:ring_allreduce[chunk_values=1024]", work, 2, Network(link, link))
    sizes = RingSizes(ExchangeSpec.parse("gradzip:qsgd:ring_allreduce[chunk_values=1024]").build())
    t = sizes.tensor(1 << 16, 2)
    assert t.chunks == 32
    scales_s, codes_s = t.scales.nbytes / 1e6, t.codes.nbytes / 1e6
    # the compressor's encode and decode of every value; a hop's pack and two adds of a slice
    work_s = 2 * codec_s * (1 << 16) + (pack_s + 2 * add_s) * math.ceil((1 << 16) / 2)
    expected = scales_s + max(codes_s, work_s) + min(codes_s, work_s) / 32
    assert pred.step_s == pytest.approx(expected, rel=1e-12)
    assert pred.comm_s == pytest.approx(scales_s + codes_s, rel=1e-12)
    assert pred.codec_s == pytest.approx(work_s, rel=1e-12)


def test_hierarchical_inside_one_node_is_the_leaders_float32_round_trip() -> None:
    inter = Link(alpha_s=1.0, gbit_per_s=1e-9)  # never used: one node
    intra = Link(alpha_s=1e-3, gbit_per_s=8.0, efficiency=1.0)
    work = _work()
    pred = predict("gradzip:qsgd:hierarchical[ranks_per_node=4]", work, 4, Network(inter, intra))
    # 3 float32 messages a tensor to the leader and 3 back, each alpha + its bytes / 1e9
    message = [len(pack_floats(torch.zeros(n), NODE_KEY)) for n in (3000, 75)]
    assert pred.bytes_per_rank == 3 * sum(message)
    assert pred.step_s == pytest.approx(2 * (6 * 1e-3 + pred.bytes_per_rank / 1e9), rel=1e-9)


def test_hierarchical_without_a_node_size_or_with_one_not_dividing_p_is_refused() -> None:
    work, net = _work(), Network(EXACT, EXACT)
    with pytest.raises(ValueError, match="ranks_per_node=K"):
        predict("gradzip:qsgd:hierarchical", work, 8, net)
    with pytest.raises(ValueError, match="does not divide the world size 6"):
        predict("gradzip:qsgd:hierarchical[ranks_per_node=4]", work, 6, net)


def test_the_projection_predicts_hierarchical_only_from_two_whole_nodes() -> None:
    variant = "gradzip:qsgd:hierarchical[ranks_per_node=8]"
    assert ranks_per_node(variant) == 8
    assert ranks_per_node("gradzip:qsgd:ring_allreduce") is None
    assert [p for p in (2, 8, 12, 16, 24, 64) if spans_nodes(variant, p)] == [16, 24, 64]
    assert spans_nodes("gradzip:qsgd:ring_allreduce", 2)
