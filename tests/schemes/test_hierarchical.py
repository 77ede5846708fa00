"""hierarchical: the node means through ring_allreduce between the leaders, full precision
inside a node, its option checked by name, bytes inside and between nodes as documented."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.errors import NonFiniteInputError
from gradzip.schemes import SchemeSpec, make_scheme

if TYPE_CHECKING:
    from tests.conftest import RunSimulatedAndProcesses


def grad(rank: int, step: int = 0, n: int = 4001) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 * step + rank)) * (1 + rank)


def hierarchical_steps(transport: Transport, k: int) -> list[bytes]:
    """Two steps of ``hierarchical[ranks_per_node=k]`` with error feedback (module level: the
    gloo processes import it)."""
    scheme = make_scheme(
        f"hierarchical[ranks_per_node={k},chunk_values=500]",
        gradzip.create("dqsg", M=2),
        run_seed=6,
        error_feedback=True,
    )
    return [
        scheme.reduce(transport, grad(transport.rank, s), s, 0).numpy().tobytes() for s in range(2)
    ]


def test_the_spec_reads_and_writes_ranks_per_node() -> None:
    spec = SchemeSpec.parse("hierarchical[ranks_per_node=4]")
    assert spec.kwargs() == {"ranks_per_node": 4}
    assert str(spec) == "hierarchical[ranks_per_node=4]"


@pytest.mark.parametrize(
    ("k", "local", "world_size", "problem"),
    [
        (3, "", 4, "does not divide"),
        (None, "3", 4, "does not divide"),
        (None, "x", 4, "LOCAL_WORLD_SIZE"),
    ],
)
def test_a_misfit_ranks_per_node_is_named_before_anything_is_sent(
    k: int | None, local: str, world_size: int, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)

    def run(t: Transport) -> str:
        scheme = make_scheme(
            "hierarchical" if k is None else f"hierarchical[ranks_per_node={k}]",
            gradzip.create("dqsg"),
        )
        with pytest.raises(ValueError, match=problem):
            scheme.reduce(t, grad(t.rank), 0, 0)
        return str(t.meter.total().sent)

    assert run_local(world_size, run) == ["0"] * world_size


def test_a_bad_ranks_per_node_value_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="ranks_per_node"):
        make_scheme("hierarchical[ranks_per_node=0]", gradzip.create("dqsg"))


@pytest.mark.parametrize(("world_size", "k"), [(4, 2), (6, 3), (4, 4)])
def test_the_result_is_ring_allreduce_of_the_node_means(world_size: int, k: int) -> None:
    """Every rank gets the bits ring_allreduce gives on ``P / K`` ranks whose gradients are the
    node means (summed in rank order, divided by ``K``, in float32)."""
    codec = gradzip.create("dqsg", M=2)

    def run(t: Transport) -> torch.Tensor:
        scheme = make_scheme(f"hierarchical[ranks_per_node={k}]", codec, run_seed=3)
        return scheme.reduce(t, grad(t.rank).view(1, -1), 1, 2)

    def node_mean(node: int) -> torch.Tensor:
        total = grad(node * k).clone()
        for r in range(node * k + 1, (node + 1) * k):
            total += grad(r)
        return total.div_(k).view(1, -1)

    def flat(t: Transport) -> torch.Tensor:
        scheme = make_scheme("ring_allreduce", codec, run_seed=3)
        return scheme.reduce(t, node_mean(t.rank), 1, 2)

    got = run_local(world_size, run)
    expected = run_local(world_size // k, flat)[0]
    assert got[0].shape == (1, 4001)
    for mean in got:
        assert torch.equal(mean, expected)


def test_bytes_inside_and_between_nodes_are_as_documented() -> None:
    n, world_size, k = 1 << 15, 8, 4
    codec = gradzip.create("dqsg", M=1)
    payload = len(codec.encode(torch.randn(n)).payload)

    def run(t: Transport) -> dict[str, int]:
        scheme = make_scheme(f"hierarchical[ranks_per_node={k}]", codec, run_seed=0)
        scheme.reduce(t, grad(t.rank, n=n), 0, 0)
        return {c: v.sent for (_, c), v in t.meter.entries().items()}

    sent = run_local(world_size, run)
    fp32 = 4 * n + LENGTH_PREFIX_BYTES
    nodes = world_size // k
    for rank, per in enumerate(sent):
        inside = per.get("node_reduce", 0) + per.get("node_broadcast", 0)
        between = sum(v for c, v in per.items() if not c.startswith("node_"))
        if rank % k:
            assert fp32 < inside < fp32 + 100 and between == 0
        else:
            assert (k - 1) * fp32 < inside < (k - 1) * (fp32 + 100)
            ring = 2 * (nodes - 1) / nodes * payload
            assert 0.9 * ring < between <= 1.1 * ring


def test_a_flag_down_rank_is_named_on_every_rank() -> None:
    def run(t: Transport) -> object:
        scheme = make_scheme("hierarchical[ranks_per_node=2]", gradzip.create("qsgd"), run_seed=1)
        g = grad(t.rank)
        if t.rank == 3:
            g[0] = float("inf")
        return scheme.reduce_if_all_finite(t, g, 0, 0, bool(torch.isfinite(g).all()))

    assert run_local(4, run) == [[3]] * 4


def test_error_feedback_lives_on_the_leaders() -> None:
    def run(t: Transport) -> bool:
        scheme = make_scheme(
            "hierarchical[ranks_per_node=2]", gradzip.create("dqsg"), error_feedback=True
        )
        scheme.reduce(t, grad(t.rank), 0, 0)
        return any(bool(v.abs().sum() > 0) for v in scheme.snapshot()["worker"].values())

    assert run_local(4, run) == [True, False, True, False]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_nodes_of_two_give_the_same_bits_in_processes_as_in_threads(
    simulated_and_processes: RunSimulatedAndProcesses,
) -> None:
    runs = simulated_and_processes(4, hierarchical_steps, 2)
    for rank in range(4):
        assert runs.processes[rank] == runs.simulated[rank] == runs.simulated[0]


@pytest.mark.parametrize(("local", "expected"), [("", 1), ("2", 2)])
def test_without_the_option_the_node_is_torchruns_local_world(
    local: str, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    scheme = make_scheme("hierarchical", gradzip.create("dqsg"))
    assert scheme.check_group(4) == expected


def test_the_run_seed_reaches_the_leaders_scheme() -> None:
    scheme = make_scheme("hierarchical[ranks_per_node=2]", gradzip.create("dqsg"), run_seed=3)
    assert scheme.inner.run_seed == 3
    scheme.run_seed = 7
    assert (scheme.run_seed, scheme.inner.run_seed) == (7, 7)


#: a batch (a DDP bucket's parameters): several shapes, an empty one among them
BATCH_SIZES = [(20, 10), (10,), (0,), (7, 3)]


def batch_grads(rank: int, step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(shape, generator=gen) * (1 + rank) for shape in BATCH_SIZES]


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_batch_gives_one_by_ones_bits_in_fewer_messages(world_size: int) -> None:
    """One flag all-gather, one message up and one down per node member, the leaders' batch:
    the means and the leaders' residuals of one tensor at a time, bit for bit."""
    indices = [2, 3, 4, 5]

    def run(t: Transport, batch: bool) -> tuple[list[bytes], list[bytes], int]:
        scheme = make_scheme(
            "hierarchical[ranks_per_node=2,chunk_values=50]",
            gradzip.create("dqsg", M=2),
            run_seed=6,
            error_feedback=True,
        )
        means = []
        for step in range(2):
            grads = batch_grads(t.rank, step)
            if batch:
                got, down = scheme.reduce_many_if_all_finite(t, grads, indices, step, True)
                assert down == []
            else:
                got = [scheme.reduce(t, g, step, i) for g, i in zip(grads, indices, strict=True)]
            means += [m.numpy().tobytes() for m in got]
        residuals = [v.numpy().tobytes() for _, v in sorted(scheme.snapshot()["worker"].items())]
        return means, residuals, t.meter.total(step=1).messages

    alone = run_local(world_size, lambda t: run(t, False))
    batch = run_local(world_size, lambda t: run(t, True))
    for rank in range(world_size):
        assert batch[rank][:2] == alone[rank][:2]
        assert batch[rank][0] == batch[0][0]
        # the meter counts each send and each receive: one by one, each of the 4 tensors
        # (the empty one too) sends one node message and receives one, and a leader runs a
        # max ring of 2(N-1) exchanges for each of the 3 non-empty ones; the batch does each
        # once, plus the flag all-gather (P - 1 records)
        leader_rings = 2 * (world_size // 2 - 1) if rank % 2 == 0 else 0
        saved = 3 * 2 + 2 * leader_rings - (world_size - 1)
        assert batch[rank][2] == alone[rank][2] - saved


def test_a_flag_down_rank_in_a_batch_is_named_on_every_rank() -> None:
    def run(t: Transport) -> object:
        scheme = make_scheme("hierarchical[ranks_per_node=2]", gradzip.create("qsgd"), run_seed=1)
        grads = batch_grads(t.rank, 0)
        if t.rank == 3:
            grads[-1][0, 0] = float("inf")
        got = scheme.reduce_many_if_all_finite(t, grads, [0, 1, 2, 3], 0, True)
        return got, t.meter.total(step=0).messages

    assert run_local(4, run) == [(([], [3]), 3)] * 4


def test_a_node_sum_that_overflows_stops_every_rank_at_once() -> None:
    """Finite inputs whose node sum overflows float32 (a DDP bucket's batch): both leaders
    learn it from their flag all-gather and raise, and each sends its members a notice in
    place of the node mean, so they raise the same error class at once (before, the members
    waited for the mean until the transport's timeout; the short one here makes that a
    failure)."""
    big = float(torch.finfo(torch.float32).max) * 0.75

    def run(t: Transport) -> str:
        scheme = make_scheme("hierarchical[ranks_per_node=2]", gradzip.create("qsgd"), run_seed=1)
        grads = [torch.full((6,), big if t.rank < 2 else 1.0), torch.ones(3)]
        try:
            scheme.reduce_many_if_all_finite(t, grads, [0, 1], 0, True)
        except NonFiniteInputError as err:
            return str(err)
        return "no error"

    outcomes = run_local(4, run, timeout=30.0)
    assert all("leader(s) [0] overflowed float32 at step 0" in text for text in outcomes)
    assert "rank 1's node leader (rank 0) abandoned step 0" in outcomes[1]
    assert "rank 3's node leader (rank 2) abandoned step 0" in outcomes[3]
