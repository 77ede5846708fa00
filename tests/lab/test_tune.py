"""``gradzip tune``: a 2-rank gloo run on localhost measures the link (positive, finite alpha
and rate), ranks the variants and names one whose spelling parses; offline, the command line
prints the ranking and a snippet; bad options are refused before anything loads."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest
import torch

from gradzip.comm.local import run_local
from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import Transport
from gradzip.integrations.ddp import GradzipHookState
from gradzip.schemes.base import Scheme
from gradzip.schemes.spec import ExchangeSpec
from gradzip_lab.cli.tune import add_tune_parser
from gradzip_lab.tune import CANDIDATES, candidates, snippet

TORCH_VARIANTS = {"fp32", "fp16_hook", "powersgd_r1"}


def _tune_rank(transport: Any) -> tuple[str, float, float, float, float, float]:
    from gradzip_lab.tune_run import tune

    result = tune("fc-300-100", sizes_mb=(0.25, 1.0), codec_numel=1 << 16)
    assert result.measured is not None
    m = result.measured
    # the measured all-to-all efficiency is the one the model's link prices all-to-alls at
    return (result.best, m.alpha_s, m.gbit_per_s, result.seconds, m.alltoall_efficiency,
            result.link.alltoall_efficiency)  # fmt: skip


def _parses(variant: str) -> bool:
    if variant in TORCH_VARIANTS:
        return True
    return str(ExchangeSpec.parse(variant)) == variant


@pytest.mark.distributed
def test_two_gloo_ranks_tune_and_name_a_variant_that_parses() -> None:
    results = run_processes(2, _tune_rank, timeout=120.0)
    assert results[0][:3] == results[1][:3] or results[0][1:3] == results[1][1:3]
    best, alpha, gbit, seconds, efficiency, priced = results[0]
    assert results[0][4] == results[1][4]  # the slowest rank's times: the same on both
    assert math.isfinite(efficiency) and efficiency > 0 and priced == min(1.0, efficiency)
    assert best in CANDIDATES and _parses(best)
    assert math.isfinite(alpha) and alpha >= 0
    assert math.isfinite(gbit) and gbit > 0
    assert math.isfinite(seconds) and seconds > 0  # the time it prints (no wall-clock margin)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gradzip")
    add_tune_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_offline_tune_prints_a_ranking_and_a_snippet(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", "--model", "fc-300-100", "--world-size", "8", "--link-rate", "1"]
    assert _main(argv) == 0
    out = capsys.readouterr().out
    best = out.split("use: ", 1)[1].split()[0]
    assert _parses(best)
    assert snippet(best).splitlines()[0] in out


def test_offline_tune_with_nodes_ranks_the_hierarchical_candidate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["tune", "--model", "fc-300-100", "--world-size", "8", "--link-rate", "1"]
    assert _main([*argv, "--ranks-per-node", "4", "--intra-link-rate", "100"]) == 0
    assert "gradzip:qsgd:hierarchical[ranks_per_node=4]" in capsys.readouterr().out
    assert _main([*argv, "--ranks-per-node", "0"]) == 2
    assert "--ranks-per-node must be >= 1, got 0" in capsys.readouterr().err


def test_half_an_offline_link_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["tune", "--world-size", "8"]) == 2
    assert "both --world-size and --link-rate" in capsys.readouterr().err


def test_every_candidate_has_a_snippet_and_parses() -> None:
    for variant in candidates(16, local_world_size=8):
        assert _parses(variant)
        assert snippet(variant)


def test_the_ring_is_always_a_candidate_and_hierarchical_only_across_whole_nodes() -> None:
    assert "gradzip:qsgd:ring_allreduce" in CANDIDATES
    assert not any("hier" in v for v in CANDIDATES)
    assert candidates(16, local_world_size=8)[-1] == "gradzip:qsgd:hierarchical[ranks_per_node=8]"
    for world, local in [(16, 1), (8, 8), (12, 8)]:  # one rank a node, one node, not dividing
        assert candidates(world, local_world_size=local) == CANDIDATES
    with pytest.raises(ValueError, match="ranks per node must be a positive int"):
        candidates(16, local_world_size=0)


def test_every_gradzip_snippet_builds_its_scheme() -> None:
    """The snippet's lines up to the hook's registration run as printed (that line needs a
    real DDP model) and build the scheme the variant names."""
    for variant in candidates(16, local_world_size=8):
        if variant in TORCH_VARIANTS:
            continue
        lines = snippet(variant).splitlines()
        assert lines[-1] == "state = register_gradzip_hook(ddp, scheme)"
        namespace: dict[str, Any] = {}
        exec("\n".join(lines[:-1]), namespace)
        assert isinstance(namespace["scheme"], Scheme)
        assert namespace["scheme"].name == ExchangeSpec.parse(variant).scheme.name


def test_the_hook_runs_the_hierarchical_candidate_as_the_scheme_reduces() -> None:
    """The DDP hook state (what the snippet registers) runs the hierarchical candidate over 4
    ranks, 2 a node, and gives the scheme's own means."""
    from tests.integrations.test_ddp_hook import _grads, _run_step

    variant = candidates(4, local_world_size=2)[-1]
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]

    def body(transport: Transport) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        state = GradzipHookState(ExchangeSpec.parse(variant).build(run_seed=3), net, transport)
        grads = _grads(transport.rank, 0, shapes)
        hooked = _run_step(state, params, grads, [(3, 2), (1, 0)])
        state.close()
        direct = ExchangeSpec.parse(variant).build(run_seed=3)
        means = [direct.reduce(transport, g, 0, i) for i, g in enumerate(grads)]
        return hooked, means

    for hooked, means in run_local(4, body):
        for a, b in zip(hooked, means, strict=True):
            assert torch.equal(a, b)


def test_the_link_sizes_stop_before_one_predicted_over_the_budget() -> None:
    from gradzip_lab.tune_link import next_size_fits

    # eight ranks at 1 Gbit/s on two cores: 16 MB took 1.07 s, so 64 MB (about 4.3 s) is not
    # timed under a 2 s budget; 4 MB's 0.25 s lets 16 MB (about 1 s) be timed
    assert not next_size_fits(1.07, 16, 64, 2.0)
    assert next_size_fits(0.25, 4, 16, 2.0)
    assert next_size_fits(0.5, 4, 16, 2.0)  # exactly the budget still fits
    assert not next_size_fits(0.5, 4, 16.1, 2.0)
