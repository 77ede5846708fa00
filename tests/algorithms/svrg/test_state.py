"""Checkpoints of LPC-SVRG, ALPC-SVRG and the SGD baselines: a run resumed from a
``state_dict`` (through ``torch.save``/``torch.load(weights_only=True)``, on fresh transports)
is bit-identical to the uninterrupted run, mid-epoch or at an epoch's end; a mismatched or
malformed state raises a clear error and changes nothing. Also: an update that overflows
raises on every rank before anything (iterates, ECQ-SGD residuals) changes."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from typing import Any

import pytest
import torch

from gradzip.algorithms.svrg import (
    ALPCSVRG,
    L1,
    LPCSVRG,
    ALPCSVRGConfig,
    DistributedAlgorithm,
    LPCSVRGConfig,
    QuantizedSGD,
    SGDConfig,
    synthetic_regression,
)
from gradzip.comm.local import LocalGroup, run_local
from gradzip.comm.transport import Transport
from gradzip.errors import NonFiniteInputError

PROBLEM, _ = synthetic_regression(120, 16, seed=2)
Build = Callable[[Transport], DistributedAlgorithm]

BUILDS: dict[str, Build] = {
    # mid-epoch resume (gbar held), the drawn nonconvex output, clipping and a prox
    "lpc-a": lambda t: LPCSVRG(
        t,
        PROBLEM,
        LPCSVRGConfig(epochs=3, inner=5, lr=0.05, batch=4, b=3, theta=0.7, output="random"),
        prox=L1(0.01),
    ),
    "lpc-b": lambda t: LPCSVRG(
        t, PROBLEM, LPCSVRGConfig(epochs=3, inner=5, lr=0.05, batch=4, b=4, scheme="b")
    ),
    "lpc-c": lambda t: LPCSVRG(
        t, PROBLEM, LPCSVRGConfig(epochs=3, inner=5, lr=0.05, batch=4, b=4, scheme="c")
    ),
    "alpc-2": lambda t: ALPCSVRG(
        t, PROBLEM, ALPCSVRGConfig(epochs=3, inner=5, L=8.0, sigma=0.2, batch=4, b=4)
    ),
    "alpc-3": lambda t: ALPCSVRG(
        t,
        PROBLEM,
        ALPCSVRGConfig(epochs=3, inner=5, L=8.0, strongly_convex=False, batch=4, scheme="b"),
    ),
    "ecq-sgd": lambda t: QuantizedSGD(
        t, PROBLEM, SGDConfig(steps=15, lr=0.02, batch=4, method="ecq-sgd", levels=1)
    ),
}


def iterates(a: DistributedAlgorithm) -> bytes:
    tensors = [a.point(), a.output()]
    if isinstance(a, ALPCSVRG):
        tensors += [a.z, a.x_tilde]
    return b"".join(t.numpy().tobytes() for t in tensors)


def summary(a: DistributedAlgorithm, digests: list[str]) -> dict[str, Any]:
    """Everything a run produces except wall times: per-round iterate digests, the output,
    the trace and the bit totals."""
    result = a.run(on_step=lambda b: digests.append(hashlib.sha256(iterates(b)).hexdigest()))
    trace = result.trace.to_dict()
    del trace["seconds"]
    return {
        "digests": digests,
        "x": result.x.numpy().tobytes(),
        "trace": trace,
        "bits": (result.bits, result.full_bits, result.steps),
    }


def saved_and_reloaded(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


@pytest.mark.parametrize("name", list(BUILDS))
@pytest.mark.parametrize("stop", [7, 10])
def test_resumed_run_is_bit_identical(name: str, stop: int) -> None:
    """Round 7 is mid-epoch (the epoch's full gradient is part of the state), round 10 ends
    the second epoch."""
    build = BUILDS[name]
    whole = run_local(2, lambda t: summary(build(t), []))

    def first_part(t: Transport) -> tuple[dict[str, Any], list[str]]:
        algo = build(t)
        algo.recorder.maybe_record(0, algo.point, force=True)  # as run() does first
        digests = []
        for _ in range(stop):
            ended = algo.advance()
            algo.recorder.count(algo.step - 1)
            digests.append(hashlib.sha256(iterates(algo)).hexdigest())
            algo.recorder.maybe_record(algo.step, algo.point, force=ended)
        return saved_and_reloaded(algo.state_dict()), digests

    states = run_local(2, first_part)

    def second_part(t: Transport) -> dict[str, Any]:
        algo = build(t)
        state, digests = states[t.rank]
        algo.load_state_dict(state)
        return summary(algo, list(digests))

    resumed = run_local(2, second_part)
    assert resumed == whole
    if name == "ecq-sgd":  # the residuals really are part of the state
        assert states[0][0]["scheme"]["feedback"]["worker"]["residual"]


def test_a_lost_residual_would_show() -> None:
    """The check above can fail: resuming ECQ-SGD with its residuals zeroed changes the run."""
    build = BUILDS["ecq-sgd"]
    whole = run_local(2, lambda t: summary(build(t), []))

    def resumed(t: Transport) -> dict[str, Any]:
        algo = build(t)
        for _ in range(5):
            algo.advance()
        state = algo.state_dict()
        fresh = build(t)
        state["scheme"] = fresh.state_dict()["scheme"]
        fresh.load_state_dict(state)
        return summary(fresh, [])

    assert run_local(2, resumed)[0]["x"] != whole[0]["x"]


def alone(rank: int = 0, size: int = 2) -> Transport:
    return LocalGroup(size).endpoint(rank)


def fingerprint_of(algo: DistributedAlgorithm) -> str:
    """A digest of the whole state but the recorder's clock."""
    state = algo.state_dict()
    del state["recorder"]["elapsed"]
    return hashlib.sha256(repr(sorted(state.items())).encode()).hexdigest()


def test_mismatched_states_are_refused_and_change_nothing() -> None:
    lpc = BUILDS["lpc-b"](alone())
    state = lpc.state_dict()
    cases: list[tuple[DistributedAlgorithm, dict[str, Any], str]] = [
        (BUILDS["alpc-2"](alone()), state, "of 'LPCSVRG', not ALPCSVRG"),
        (BUILDS["lpc-b"](alone(rank=1)), state, "rank: saved 0, here 1"),
        (BUILDS["lpc-b"](alone(size=3)), state, "world_size: saved 2, here 3"),
        (
            LPCSVRG(
                alone(), PROBLEM, LPCSVRGConfig(epochs=3, inner=5, lr=0.1, batch=4, scheme="b")
            ),
            state,
            "config.lr: saved 0.05, here 0.1",
        ),
        (BUILDS["lpc-b"](alone()), {**state, "version": 9}, "version 9"),
        (BUILDS["lpc-b"](alone()), {**state, "recorder": None}, "recorder state must be"),
        (BUILDS["lpc-b"](alone()), {**state, "step": 3}, "do not add up to step 3"),
        (
            BUILDS["lpc-b"](alone()),
            {**state, "tensors": {**state["tensors"], "x": torch.zeros(3)}},
            "tensor 'x' must be",
        ),
        (
            BUILDS["lpc-b"](alone()),
            {
                **state,
                "tensors": {
                    **state["tensors"],
                    "x": torch.full((16,), float("nan"), dtype=torch.float64),
                },
            },
            "NaN",
        ),
        (
            BUILDS["lpc-b"](alone()),
            {**state, "scheme": BUILDS["ecq-sgd"](alone()).state_dict()["scheme"]},
            "does not fit this scheme",
        ),
    ]
    other_problem, _ = synthetic_regression(120, 17, seed=2)
    cases.append(
        (
            LPCSVRG(
                alone(),
                other_problem,
                LPCSVRGConfig(epochs=3, inner=5, lr=0.05, batch=4, b=4, scheme="b"),
            ),
            state,
            "problem: saved",
        )
    )
    for algo, bad, message in cases:
        before = fingerprint_of(algo)
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            algo.load_state_dict(bad)
        assert fingerprint_of(algo) == before


def test_a_state_of_other_data_is_refused() -> None:
    """Same size, other data: the resolved step (1/(3 L_max)) differs and names it."""
    other, _ = synthetic_regression(120, 16, seed=3)
    config = LPCSVRGConfig(epochs=1, batch=4)
    state = LPCSVRG(alone(), PROBLEM, config).state_dict()
    with pytest.raises(ValueError, match=r"resolved\.lr"):
        LPCSVRG(alone(), other, config).load_state_dict(state)


# -- an update that overflows ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lpc", "alpc", "ecq-sgd"])
def test_overflowing_update_raises_everywhere_and_changes_nothing(name: str) -> None:
    """A step size so large that the first update overflows float32 while the gradients are
    finite: the round raises on every rank, and the iterates, counters and ECQ-SGD's residuals
    (which the round's average had already updated) stay as they were. Without the check the
    infinite iterate would be stored and only the next round would fail."""
    data, _ = synthetic_regression(60, 8, seed=1, dtype=torch.float32)
    builds: dict[str, Build] = {
        "lpc": lambda t: LPCSVRG(t, data, LPCSVRGConfig(epochs=2, inner=4, lr=1e300, batch=4)),
        "alpc": lambda t: ALPCSVRG(
            t, data, ALPCSVRGConfig(epochs=2, inner=4, L=1e-300, strongly_convex=False, batch=4)
        ),
        "ecq-sgd": lambda t: QuantizedSGD(
            t, data, SGDConfig(steps=8, lr=1e300, batch=4, method="ecq-sgd")
        ),
    }

    def fn(t: Transport) -> str:
        algo = builds[name](t)
        before = fingerprint_of(algo)
        with pytest.raises(NonFiniteInputError, match=r"round 0: the new .* NaN or Inf"):
            algo.advance()
        assert fingerprint_of(algo) == before
        return before

    run_local(2, fn)
