"""The byte meter's step scopes: every message is counted under the step of the innermost scope
open when it travels (``None`` outside any), scopes nest, and the enclosing step comes back on
exit, also when the block raises."""

from __future__ import annotations

import pytest

from gradzip.comm.local import run_local
from gradzip.comm.meter import ANY_STEP, ByteMeter
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport, in_step_scope


def steps_of(transport: Transport) -> dict[int | None, int]:
    """Messages counted per step (every collective together)."""
    out: dict[int | None, int] = {}
    for (step, _), traffic in transport.meter.entries().items():
        out[step] = out.get(step, 0) + traffic.messages
    return out


def test_scopes_nest_and_restore_the_enclosing_step() -> None:
    meter = ByteMeter()
    assert meter.step is None
    with meter.step_scope(3):
        assert meter.step == 3
        with meter.step_scope(None):
            assert meter.step is None
            with meter.step_scope(4):
                assert meter.step == 4
            assert meter.step is None
        assert meter.step == 3
    assert meter.step is None


def test_a_raising_block_restores_the_enclosing_step() -> None:
    meter = ByteMeter()
    with meter.step_scope(1):
        with pytest.raises(RuntimeError, match="boom"), meter.step_scope(2):
            meter.record("x", 5, 0)
            raise RuntimeError("boom")
        assert meter.step == 1
        meter.record("x", 7, 0)
    assert meter.step is None
    assert meter.total(step=2).sent == 5
    assert meter.total(step=1).sent == 7


def test_total_of_step_none_is_the_traffic_outside_any_step() -> None:
    meter = ByteMeter()
    meter.record("barrier", 3, 1)
    with meter.step_scope(0):
        meter.record("x", 5, 2)
    assert (meter.total(step=None).sent, meter.total(step=None).received) == (3, 1)
    assert meter.total(step=0).sent == 5
    assert meter.total().sent == 8  # the default: every entry
    assert meter.total(step=ANY_STEP, collective="x").sent == 5
    assert meter.total(step=7).sent == 0


def test_the_step_cannot_be_set_outside_a_scope() -> None:
    meter = ByteMeter()
    with pytest.raises(AttributeError):
        meter.step = 1  # type: ignore[misc]


def scoped_traffic(transport: Transport) -> tuple[dict[int | None, int], int, int]:
    """All-gathers outside any scope, in step 0, in a ``None`` scope inside step 1, and in
    step 1 after it; the messages per step, and the bytes sent in steps 0 and 1."""
    transport.all_gather_bytes(b"a")
    with transport.step_scope(0):
        transport.all_gather_bytes(b"bb")
    with transport.step_scope(1):
        with transport.step_scope(None):
            transport.all_gather_bytes(b"c")
        transport.all_gather_bytes(b"ddd")
    meter = transport.meter
    return steps_of(transport), meter.total(step=0).sent, meter.total(step=1).sent


def test_bytes_are_counted_under_the_innermost_scope_of_their_transfer() -> None:
    world = 3
    rounds = world - 1  # a ring all-gather: P - 1 messages per rank
    for per_step, sent0, sent1 in run_local(world, scoped_traffic):
        assert per_step == {None: 2 * rounds, 0: rounds, 1: rounds}
        assert sent0 == rounds * (2 + LENGTH_PREFIX_BYTES)
        assert sent1 == rounds * (3 + LENGTH_PREFIX_BYTES)


class Sender:
    @in_step_scope
    def send(self, transport: Transport, payload: bytes, step: int, fail: bool = False) -> int:
        transport.all_gather_bytes(payload)
        if fail:
            raise ValueError("failed after sending")
        return transport.meter.step or 0


def decorated_traffic(transport: Transport) -> tuple[dict[int | None, int], list[int | None]]:
    sender, seen = Sender(), []
    seen.append(sender.send(transport, b"x", 5))
    seen.append(sender.send(transport, b"x", step=6))
    seen.append(sender.send(step=7, payload=b"x", transport=transport))
    with transport.step_scope(2):
        with pytest.raises(ValueError, match="failed after sending"):
            sender.send(transport, b"x", 8, fail=True)
        seen.append(transport.meter.step)
    seen.append(transport.meter.step)
    return steps_of(transport), seen


def test_a_method_in_step_scope_counts_under_its_step_argument() -> None:
    for per_step, seen in run_local(2, decorated_traffic):
        assert per_step == {5: 1, 6: 1, 7: 1, 8: 1}
        assert seen == [5, 6, 7, 2, None]


def test_in_step_scope_needs_transport_and_step_parameters() -> None:
    with pytest.raises(TypeError, match="needs parameters transport and step"):

        @in_step_scope
        def no_step(transport: Transport) -> None:
            pass
