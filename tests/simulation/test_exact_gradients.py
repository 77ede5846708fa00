"""Simulated workers compute their gradients exactly as process ranks do, bit for bit.

``gradzip train --backend local`` computes all P gradients in one process (whose intra-op
thread count is whatever the caller set); a process rank computes only its own shard's (spawned
ranks run one thread each). Both go through :class:`PerWorkerGradients`, which must give the
same bits in both call patterns. A vectorized pass (vmap over the P shards) or a gradient on
the process's own thread count does not on every CPU: on this project's development machine
the 4096-wide Dryden MLP already differs between 1 and 2 threads, so the thread settings below
catch a path that does not pin its computation.
"""

from __future__ import annotations

import pytest
import torch

from gradzip.models.paper import MODELS, build_model
from gradzip.simulation.workers import PerWorkerGradients, WorkerGradients

WORKERS = 3


def shards(name: str, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(WORKERS, batch, *MODELS[name].input_shape, generator=generator)
    y = torch.randint(0, MODELS[name].num_classes, (WORKERS, batch), generator=generator)
    return x, y


def with_threads(threads: int, fn, *args):  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(before)


CASES = [
    ("fc-300-100", 1),
    ("fc-300-100", 7),
    ("fc-300-100", 32),
    ("lenet", 5),
    ("cifarnet", 3),
    ("dryden-mlp", 7),
]


@pytest.mark.parametrize(("name", "batch"), CASES)
def test_a_simulated_worker_equals_the_rank_that_computes_it_bitwise(name: str, batch: int) -> None:
    x, y = shards(name, batch, seed=len(name) * 100 + batch)
    simulated_model = build_model(name, 0)
    # the simulation: every worker's gradient in one process running on two threads
    simulated = with_threads(2, PerWorkerGradients(simulated_model), x, y)
    for w in range(WORKERS):
        # a spawned rank: a fresh process's own model, one thread, its shard only (as the
        # trainer slices it from the full batch)
        rank = with_threads(1, PerWorkerGradients(build_model(name, 0)), x[w : w + 1], y[w : w + 1])
        for g_sim, g_rank in zip(simulated.grads, rank.grads, strict=True):
            assert torch.equal(g_sim[w], g_rank[0]), f"{name}, batch {batch}, worker {w}"
        assert torch.equal(simulated.loss[w], rank.loss[0])
        assert torch.equal(simulated.correct[w], rank.correct[0])


def test_the_exact_pass_restores_the_callers_thread_count() -> None:
    model = build_model("fc-300-100", 0)
    x, y = shards("fc-300-100", 4, seed=1)
    threads = with_threads(2, lambda: (PerWorkerGradients(model)(x, y), torch.get_num_threads()))
    assert threads[1] == 2


def test_the_vectorized_opt_in_agrees_to_rounding_only() -> None:
    """``--vectorized-gradients`` is documented as not bit-exact; it must still be the same
    gradient up to float32 rounding."""
    x, y = shards("lenet", 6, seed=2)
    exact = PerWorkerGradients(build_model("lenet", 0))(x, y)
    fast = WorkerGradients(build_model("lenet", 0))(x, y)
    for a, b in zip(exact.grads, fast.grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5 * float(a.abs().max()))
    torch.testing.assert_close(fast.loss, exact.loss, rtol=1e-5, atol=1e-6)
