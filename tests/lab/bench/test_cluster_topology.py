"""``gradzip bench cluster --ranks-per-node``: which ranks share a node's namespace and address,
the node's links, a hierarchical variant's node size filled in, and bytes per node and per rank."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gradzip.cli import main
from gradzip.schemes.allgather_decode import AllGatherDecode
from gradzip.schemes.registry import SCHEMES
from gradzip_lab.bench import cluster_netns
from gradzip_lab.bench.cluster_netns import ClusterNetwork
from gradzip_lab.bench.cluster_report import add_topology, format_table
from gradzip_lab.bench.cluster_topology import Topology, with_ranks_per_node


def test_nodes_hold_consecutive_ranks() -> None:
    topo = Topology(8, 2)
    assert topo.nodes == 4
    assert [topo.node_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [list(topo.ranks_of(n)) for n in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.same_node(2, 3) and not topo.same_node(1, 2)
    # the ranks of a node share its address; nodes differ
    assert [topo.rank_address(r, run=5) for r in range(4)] == [
        "10.213.5.1",
        "10.213.5.1",
        "10.213.5.2",
        "10.213.5.2",
    ]
    one = Topology(3)
    assert [one.rank_address(r) for r in range(3)] == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]
    assert not one.same_node(0, 1)


@pytest.mark.parametrize(
    ("world", "per_node", "message"),
    [
        (6, 4, "6 ranks do not fill nodes of 4"),
        (4, 0, "must be >= 1"),
        (0, 1, "must be >= 1"),
    ],
)
def test_bad_topologies(world: int, per_node: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Topology(world, per_node)


def test_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rank 4 is not in \[0, 4\)"):
        Topology(4, 2).node_of(4)
    with pytest.raises(ValueError, match=r"node 2 is not in \[0, 2\)"):
        Topology(4, 2).ranks_of(2)


def test_network_has_a_namespace_and_a_link_per_node() -> None:
    net = ClusterNetwork(4, run=3, pid=77, ranks_per_node=2)
    assert [net.rank_namespace(r) for r in range(4)] == ["gzc77n0", "gzc77n0", "gzc77n1", "gzc77n1"]
    assert [net.exec_prefix(r)[-1] for r in range(4)] == [net.rank_namespace(r) for r in range(4)]
    assert [net.address(r) for r in range(4)] == ["10.213.3.1"] * 2 + ["10.213.3.2"] * 2
    # the rate limit sits on both ends of each node's link only: none between a node's ranks
    assert net.links() == [
        ("gzc77n0", "veth0"),
        ("gzc77b", "n0"),
        ("gzc77n1", "veth0"),
        ("gzc77b", "n1"),
    ]


class _FakeHierarchical(AllGatherDecode):
    """A stand-in for the hierarchical scheme where the registry has none: an all-gather that
    takes a ``ranks_per_node`` option."""

    def __init__(
        self,
        compressor: Any,
        ranks_per_node: int | None = None,
        run_seed: int = 0,
        error_feedback: bool = False,
    ) -> None:
        super().__init__(compressor, run_seed=run_seed, error_feedback=error_feedback)
        self.ranks_per_node = ranks_per_node


@pytest.fixture
def hierarchical(monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a registered scheme with a ``ranks_per_node`` option (the real one where the
    registry has it)."""
    if "hierarchical" not in SCHEMES:
        monkeypatch.setitem(SCHEMES, "hierarchical", _FakeHierarchical)
    return "hierarchical"


def test_node_size_filled_in_where_the_variant_leaves_it_out(hierarchical: str) -> None:
    filled = with_ranks_per_node(f"gradzip:qsgd:{hierarchical}", 4)
    assert filled == f"gradzip:qsgd:{hierarchical}[ranks_per_node=4]"
    assert with_ranks_per_node(f"gradzip:qsgd+ef:{hierarchical}", 2).endswith(
        f"+ef:{hierarchical}[ranks_per_node=2]"
    )
    # given and equal: unchanged but for the spec's own spelling
    assert with_ranks_per_node(filled, 4) == filled


def test_node_sizes_that_disagree_name_both(hierarchical: str) -> None:
    with pytest.raises(ValueError, match=r"ranks_per_node=4 but --ranks-per-node is 2"):
        with_ranks_per_node(f"gradzip:qsgd:{hierarchical}[ranks_per_node=4]", 2)


@pytest.mark.parametrize(
    "name", ["fp32", "powersgd_r1", "gradzip:qsgd:allgather", "gradzip:qsgd:nosuchscheme"]
)
def test_other_variants_unchanged(name: str) -> None:
    assert with_ranks_per_node(name, 2) == name


def test_command_refuses_a_world_size_nodes_cannot_hold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "cluster", "--world-sizes", "2,6", "--ranks-per-node", "4"]
    assert main(argv) == 2
    assert "world size(s) 2, 6 are no multiple of --ranks-per-node 4" in capsys.readouterr().err


def test_command_refuses_disagreeing_node_sizes(
    hierarchical: str, capsys: pytest.CaptureFixture[str]
) -> None:
    variant = f"gradzip:qsgd:{hierarchical}[ranks_per_node=4]"
    argv = ["bench", "cluster", "--world-sizes", "4", "--ranks-per-node", "2", "--model",
            "fc-300-100", "--variants", "fp32", variant]  # fmt: skip
    assert main(argv) == 2
    assert "ranks_per_node=4 but --ranks-per-node is 2" in capsys.readouterr().err


def test_rows_carry_bytes_per_node_and_per_rank() -> None:
    row = {"model": "m", "world_size": 4, "rate": "1gbit", "variant": "fp32", "step_ms": 10.0,
           "bytes_sent_per_rank": 3e6, "bytes_received_per_rank": 2e6,
           "speedup_vs_fp32": 1.0}  # fmt: skip
    add_topology(row, 2)
    assert row["ranks_per_node"] == 2
    assert (row["bytes_sent_per_node"], row["bytes_sent_per_rank"]) == (3e6, 1.5e6)
    assert (row["bytes_received_per_node"], row["bytes_received_per_rank"]) == (2e6, 1e6)
    lines = format_table([row])
    assert lines[0] == "m, P = 4, 2 nodes of 2 ranks"
    assert "3.000" in lines[3]  # the table's MB/step: the node's veth


@pytest.mark.distributed
def test_a_node_reaches_its_own_address_over_loopback_and_the_others_over_its_veth() -> None:
    """What gloo's sockets will use: from a node's namespace, its own address (the peer ranks
    of the node) routes over ``lo``, another node's over the rate-limited ``veth0``."""
    import subprocess

    reason = cluster_netns.missing_privilege()
    if reason:
        pytest.skip(reason)
    net = ClusterNetwork(4, run=251, ranks_per_node=2)
    net.setup()
    try:

        def route(rank: int, to: int) -> str:
            argv = [*net.exec_prefix(rank), "ip", "route", "get", net.address(to)]
            return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

        assert "dev lo" in route(0, 1) and route(0, 1).startswith("local")
        assert "dev veth0" in route(0, 2) and "dev veth0" in route(3, 1)
    finally:
        assert net.teardown() == []


def _fp32_row(tmp_path: Path, ranks_per_node: int) -> dict[str, Any]:
    out = tmp_path / f"k{ranks_per_node}.json"
    argv = ["bench", "cluster", "--model", "fc-300-100", "--world-sizes", "4", "--rates", "1gbit",
            "--steps", "2", "--warmup", "2", "--timeout", "600", "--ranks-per-node",
            str(ranks_per_node), "--variants", "fp32", "--json", str(out), "--png",
            str(tmp_path / f"k{ranks_per_node}.png")]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["ranks_per_node"] == ranks_per_node
    [row] = data["runs"]
    assert row["ranks_per_node"] == ranks_per_node
    return dict(row)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_nodes_own_ranks_talk_off_its_link(tmp_path: Path) -> None:
    """P = 4 fp32 DDP (gloo's all-reduce of the 266,610 gradients, 1.07 MB), one rank per
    node against two: with two, half of each rank's peers share its node, and what they
    exchange stays off the veth, so the wire bytes per rank (node / 2) fall well below those
    of one rank per node. [CHOICE] bound 0.8: gloo's ring all-reduce sends 2 (P - 1) / P of the
    buffer per rank whichever the topology; at K = 2 half the ring's hops stay in a node
    (expected ratio 0.5), TCP's ACKs and headers add a few percent to both."""
    reason = cluster_netns.missing_privilege()
    if reason:
        pytest.skip(reason)
    alone, paired = _fp32_row(tmp_path, 1), _fp32_row(tmp_path, 2)
    assert alone["bytes_sent_per_node"] == alone["bytes_sent_per_rank"]
    assert paired["bytes_sent_per_rank"] == paired["bytes_sent_per_node"] / 2
    # every rank still all-reduces the whole gradient: at least one buffer crosses a node's link
    assert paired["bytes_sent_per_node"] > 266_610 * 4
    assert paired["bytes_sent_per_rank"] < 0.8 * alone["bytes_sent_per_rank"], (paired, alone)
    # the namespaces are gone
    mine = f"{cluster_netns.PREFIX}{os.getpid()}"
    assert not [n for n in cluster_netns.list_namespaces() if n.startswith(mine)]
